"""Data-making methods beside GRADMM: Private Evolution (``pe``) and DP fine-tune-then-generate (``dp_finetune``)."""
