"""Qwen2-VL and Qwen2.5-VL for rlx: a VLM processor registered for both model types, and
``rlx qwen-vl`` commands that make a tiny random model and a synthetic image (or video)
task to try them on a CPU.

Prompts with images and videos then run through rollout, rewards and every algorithm that
takes them (``docs/multimodal.md``). Nothing heavy is imported until a run builds the processor.
"""

from rlx import hookimpl

MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl")


def qwen_vl_processor(model_path: str, *, config):
    from rlx_qwen_vl.processor import QwenVLProcessor

    return QwenVLProcessor(model_path, config=config)


@hookimpl
def register_vlm_processors(register):
    for name in MODEL_TYPES:
        register(name, qwen_vl_processor)


@hookimpl
def register_commands(app):
    import typer

    commands = typer.Typer(help="Qwen-VL: a tiny random model and the shapes task, to try image and video runs "
                                "on a CPU.")

    @commands.command("tiny")
    def tiny(out: str = typer.Argument(..., help="folder to write the model, tokenizer and image processor to"),
             arch: str = typer.Option("qwen2_5_vl", help="qwen2_5_vl or qwen2_vl")):
        """Write a tiny random Qwen2.5-VL (or Qwen2-VL)."""
        from rlx_qwen_vl.tiny import make_tiny_qwen_vl

        if arch not in MODEL_TYPES:
            raise typer.BadParameter(f"{arch!r} is not one of {', '.join(MODEL_TYPES)}", param_hint="--arch")
        typer.echo(make_tiny_qwen_vl(out, arch=arch))

    @commands.command("shapes")
    def shapes(out: str = typer.Argument(..., help="folder to write images/ and the JSON lines files to"),
               rows: int = typer.Option(256, help="rows (one image each)"),
               seed: int = typer.Option(0, help="seed of the shapes and colours"),
               video: bool = typer.Option(False, help='the video form: "Which way does the square move?" over '
                                                      "4 frames per row")):
        """Write the shapes task: "What colour is the square?" over one coloured shape per image."""
        from rlx_qwen_vl.shapes import write_dataset, write_video_dataset

        for kind, path in (write_video_dataset if video else write_dataset)(out, rows, seed=seed).items():
            typer.echo(f"{kind}: {path}")

    app.add_typer(commands, name="qwen-vl")
