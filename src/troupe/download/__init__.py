"""Downloads from a Hugging Face-compatible hub into the HF cache (``POST /models``,
``troupe pull``, remote presets): plan, transfer with resume and verification, journal."""
