"""``python -m troupe.testing.fake_engine <llama-server arguments>``."""

from troupe.testing.fake_engine.server import main

raise SystemExit(main())
