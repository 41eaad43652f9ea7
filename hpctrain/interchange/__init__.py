"""Models in and out: ONNX graphs mapped onto the layer kinds with their weights, nets and
trained weights written as ONNX or as PyTorch state dicts (safetensors), and the names that tie
hpctrain's tensors to PyTorch's."""
