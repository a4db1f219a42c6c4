"""Tables as bytes: a polars frame as Arrow record batches (``batches``), the content fingerprints version ids,
cache keys and Dagster data versions are made of (``fingerprint``), and tables too large to hold as strings, made
batch by batch (``streamed``).

May import: errors, runtime.
"""
