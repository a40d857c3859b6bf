"""Write docs/reference/ from the code: python tools/gen_docs.py [--check].

A maintainers' tool over ppvarlen/docs_gen.py (not a user command, so not a console script).
"""
import sys

from ppvarlen.docs_gen import main

if __name__ == "__main__":
    sys.exit(main())
