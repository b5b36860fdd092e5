from rlx_cli import main

main()
