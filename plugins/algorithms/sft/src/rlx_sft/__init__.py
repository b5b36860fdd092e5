"""Supervised fine-tuning.

L = token-mean negative log-likelihood of the response tokens over the whole optimizer
step; prompt tokens (and user/system turns of a chat) carry no loss. Rows are
``prompt`` + ``response`` or a ``messages`` chat, where only assistant turns are learnt.
"""

from rlx import AlgorithmSpec, hookimpl

SFT = AlgorithmSpec(
    name="sft",
    description="Supervised fine-tuning on prompt/response pairs or chats (response-only loss)",
    loop="offline",
    data="sft",
    head="lm",
    defaults={"training.lr": 5e-4, "training.batch_size": 32, "training.micro_batch_size": 16},
)


@hookimpl
def register_algorithms(register):
    register("sft", SFT)
