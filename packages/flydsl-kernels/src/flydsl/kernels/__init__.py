"""FlyDSL kernel zoo. No kernels yet: they arrive with the norms/softmax and GEMM work (docs/ROADMAP.md)."""
