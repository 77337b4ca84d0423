"""kjit's benchmark, `python -m kjit.bench` (benchmark.py: the cases, their timing and the command
line): kjit.torch through autograd beside the op through the C API, torch eager and torch.compile,
on a GPU. Not part of the runtime: nothing in kjit imports this package."""
