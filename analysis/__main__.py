"""``python -m analysis`` entry point."""

from analysis.cli import main

raise SystemExit(main())
