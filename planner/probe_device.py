"""What a probe's device shows of a prediction: the CPU backend has no CUDA context, cuBLAS workspace or
caching allocator, and its "device" and host memory are one."""

from __future__ import annotations

from search import Coefficients, Prediction, cpu_backend_coefficients


def device_coefficients(device: str, coef: Coefficients) -> Coefficients:
    """The CPU backend has no CUDA context, cuBLAS workspace or caching allocator."""
    if device == "cpu":
        return cpu_backend_coefficients(coef)
    return coef


def device_prediction(prediction: Prediction, device: str) -> Prediction:
    """The prediction as the probe's device measures it: on the CPU backend host-resident states (offloaded
    optimizer states, pinned buffers) are live tensors of the same memory, and reserved equals allocated."""
    return prediction.on_cpu_backend() if device == "cpu" else prediction
