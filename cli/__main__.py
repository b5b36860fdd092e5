from rlx.cli import main

main()
