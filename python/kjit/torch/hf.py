"""The old name of kjit.torch.integrations.hf (Hugging Face models), which the README documented: the
same names, for code that imports kjit.torch.hf."""

from kjit.torch.integrations.hf import *  # noqa: F401,F403
