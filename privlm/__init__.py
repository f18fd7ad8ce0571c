"""privlm: differentially private fine-tuning and synthetic text for Hugging Face causal LMs."""

__version__ = "0.1.0"
