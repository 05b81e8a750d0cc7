"""A fill task that says which GPU its process works on (tests/test_fill_executor.py imports it by name)."""

import torch
from fill_mlp import MlpFill


class DeviceFill(MlpFill):
    def state_dict(self) -> dict:
        return {**super().state_dict(), "cuda_device": torch.cuda.current_device()}
