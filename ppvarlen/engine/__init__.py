"""Training engine: ``train(cfg)``, ``evaluate_checkpoint``, ``load_for_inference``."""
from .checkpoint import load_for_inference
from .evaluate import evaluate_checkpoint
from .trainer import train

__all__ = ["train", "evaluate_checkpoint", "load_for_inference"]
