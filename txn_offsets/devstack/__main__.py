"""`python -m txn_offsets.devstack up|down|status` (also available as `txn-offsets dev ...`)."""

from txn_offsets.cli import main

if __name__ == "__main__":
    raise SystemExit(main(["dev", *__import__("sys").argv[1:]]))
