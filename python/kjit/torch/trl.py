"""The old name of kjit.torch.integrations.trl (TRL), which the README documented: the
same names, for code that imports kjit.torch.trl."""

from kjit.torch.integrations.trl import *  # noqa: F401,F403
