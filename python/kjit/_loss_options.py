"""The five options every loss op takes, as one value from the public functions to the C API.

kjit.Runtime's loss ops and kjit.torch's losses take them as keywords (ignore_index=,
reduction=, ...) and carry them on as one LossOptions; the torch.library custom ops, whose schema
takes no such value, take its fields as the scalars of SCHEMA, one fragment for every op.

    options = LossOptions(ignore_index=-100, reduction="sum")
    f"(Tensor logits, Tensor target, {SCHEMA}) -> Tensor"
    LossOptions(*scalars)                     # a custom op's arguments back as the value
"""

from typing import NamedTuple


class LossOptions(NamedTuple):
    """kjit_loss_options' fields that change what the loss is (kjit/loss_options.h); the rest
    (the target type, class weights, argmax, entropy) follow from the tensors and the outputs
    asked for."""
    ignore_index: int = -100
    reduction: str = "mean"        # "none", "sum" or "mean"
    label_smoothing: float = 0.0
    z_loss: float = 0.0            # adds z_loss * lse^2 per row
    softcap: float = 0.0           # softcap * tanh(x / softcap) first; 0: off (None in the APIs)


# The options' part of a custom op's schema, "int ignore_index, str reduction, ...": the
# annotations' type names are the schema's.
SCHEMA = ", ".join(f"{annotation.__name__} {name}"
                   for name, annotation in LossOptions.__annotations__.items())
