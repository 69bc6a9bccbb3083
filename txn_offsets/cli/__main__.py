"""``python -m txn_offsets.cli``: the same as the ``txn-offsets`` command."""

from txn_offsets.cli.main import main

raise SystemExit(main())
