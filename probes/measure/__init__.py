"""What a probe measures with: the live-tensor tracker of the CPU backend (``tracker``), the device and host
fingerprint (``fingerprint``) and what this CPU runs fast (``cpu_support``).

Imports only ``store``.
"""
