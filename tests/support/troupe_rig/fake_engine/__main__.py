"""``python -m troupe_rig.fake_engine <llama-server arguments>``."""

from troupe_rig.fake_engine.server import main

raise SystemExit(main())
