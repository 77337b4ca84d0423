"""The old name of kjit.torch.integrations.verl (verl), which the README documented: the
same names, for code that imports kjit.torch.verl."""

from kjit.torch.integrations.verl import *  # noqa: F401,F403
