"""Type stubs for moe_engine.torch (python/moe_engine/torch.py)."""

from typing import Any, Dict, Optional, Tuple, Union

import torch

__all__ = ["MoELayer"]

# aux: load_balance_loss, z_loss (0-d float32 tensors, float64 for float64 compute), group_sizes,
# topk_idx, topk_weights (tensors), dropped and nonfinite_tokens (ints).
_Aux = Dict[str, Union[torch.Tensor, int]]

class MoELayer(torch.nn.Module):
    config: Dict[str, Union[int, float, bool, str, None]]
    accumulate_grads: bool
    router: torch.nn.Parameter
    wo: torch.nn.Parameter
    # wi_0 and wi_1, or wi with prefuse_moe_weights=True
    wi_0: torch.nn.Parameter
    wi_1: torch.nn.Parameter
    wi: torch.nn.Parameter

    def __init__(
        self,
        num_experts: int,
        num_experts_per_tok: int,
        emb_dim: int,
        moe_mlp_dim: int,
        dtype: Optional[torch.dtype] = ...,
        distributed: Optional[bool] = ...,
        accumulate_grads: bool = ...,
        **config: Any,
    ) -> None: ...
    @property
    def distributed(self) -> bool: ...
    @property
    def compute_dtype(self) -> Optional[torch.dtype]: ...
    def step_memory_minimum(self, tokens: int, x_dtype: torch.dtype = ...) -> Dict[str, float]: ...
    def permutes_in_gemm(self, x_dtype: torch.dtype = ...) -> bool: ...
    def extra_repr(self) -> str: ...
    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, _Aux]: ...
    def __call__(self, x: torch.Tensor) -> Tuple[torch.Tensor, _Aux]: ...
    def load_mixtral_block(self, state_dict: Dict[str, torch.Tensor]) -> None: ...
    def export_mixtral_block(self) -> Dict[str, torch.Tensor]: ...
    def __getstate__(self) -> Dict[str, Any]: ...
    def __setstate__(self, state: Dict[str, Any]) -> None: ...
