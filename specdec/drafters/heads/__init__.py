"""Drafting heads on the target's features: EAGLE and EAGLE-3 (eagle, with its head networks eagle_head and
eagle3_head, the published checkpoints' layouts, loading, device and kernel variants), Medusa (medusa,
medusa_head and its variants), the captured drafting steps (head_graphs), the confidence calibration
(calibration), and the exporters to vLLM and SGLang (head_export). Training builds the same head networks."""
