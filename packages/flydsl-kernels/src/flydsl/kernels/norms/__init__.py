"""LayerNorm, RMSNorm and the fused residual add + RMSNorm, forward and backward (:mod:`.api`: the public functions
and their contract; :mod:`.forward`, :mod:`.backward`: the kernels and their launch)."""

from flydsl.kernels.norms.api import fused_add_rms_norm, layer_norm, layer_norm_backward, rms_norm, rms_norm_backward

__all__ = ["layer_norm", "layer_norm_backward", "rms_norm", "rms_norm_backward", "fused_add_rms_norm"]
