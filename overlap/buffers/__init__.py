"""Userbuffer managers: copy quantized shards (data + scale_inv) into symmetric buffers and hand
gathered tensors out, never letting a saved activation alias a buffer (DESIGN.md §3).

This package is empty until the buffer-manager issue lands; it exists so that the layout of
DESIGN.md §1 is in place.
"""
