"""``python -m cli``: the ``edgeplug`` command without its console script."""

from cli.main import main

raise SystemExit(main())
