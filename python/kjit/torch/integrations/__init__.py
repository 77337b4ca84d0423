"""kjit in training frameworks, one module each, which imports its framework (import the one you
use): hf (Hugging Face models: apply_to, exported as kjit.torch.apply_to), trainer (Hugging Face's
Trainer), trl (TRL's SFT and GRPO trainers) and verl (verl's fused lm_head + log-probs)."""
