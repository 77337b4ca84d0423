"""The old name of kjit.torch.integrations.trainer (Hugging Face's Trainer), which the README documented: the
same names, for code that imports kjit.torch.trainer."""

from kjit.torch.integrations.trainer import *  # noqa: F401,F403
