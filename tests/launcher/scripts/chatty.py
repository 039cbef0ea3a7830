"""Every rank writes many long lines quickly, to check lines never mix."""

import os
import sys

rank = os.environ["RANK"]
for i in range(int(sys.argv[1])):
    sys.stdout.write(f"R{rank}-{i:05d}-" + rank * 300 + "\n")
sys.stdout.write(f"R{rank}-tail-without-newline")
