"""Process groups from torchrun's variables, checkpoints and preemption signals."""
