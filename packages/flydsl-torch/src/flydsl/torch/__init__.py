"""FlyDSL kernels as torch ops. No ops yet: they arrive with the kernels (docs/ROADMAP.md)."""
