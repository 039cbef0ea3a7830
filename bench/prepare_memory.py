"""Peak memory of ``distlaunch data prepare`` on one very long document, against encoding it whole.

    python bench/prepare_memory.py [--mb 10]

A text file of one --mb MB line (the bundled corpus repeated, newlines turned into spaces) is
prepared with a byte-level BPE tokenizer.json trained on the bundled corpus, the way
``distlaunch data prepare`` does it (long documents encoded in pieces at spaces, which gives the same
ids for this tokenizer). The reference, in the same run, is that tokenizer encoding the whole
document in one call, as prepare did before. Each runs in its own process; the script prints both
peak RSS values (the kernel's high-water mark of the child), the wall times, and the ratios.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WHOLE = """
import sys
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
with open(sys.argv[2], encoding="utf-8") as f:
    ids = tok.encode(f.read(), add_special_tokens=False).ids
print(len(ids))
"""


def peak_of(argv: list[str]) -> tuple[float, float]:
    """(peak RSS in MiB, wall seconds) of one child process; each measurement in a fresh wrapper process,
    so RUSAGE_CHILDREN holds that child alone."""
    probe = (
        "import resource, subprocess, sys, time; t = time.perf_counter(); "
        "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, time.perf_counter() - t)"
    )
    out = subprocess.run([sys.executable, "-c", probe, *argv], check=True, capture_output=True, text=True, cwd=REPO)
    peak, seconds = out.stdout.split()
    return float(peak), float(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=10.0, help="size of the one-line document")
    args = parser.parse_args()
    corpus = (REPO / "distlaunch" / "data" / "corpus.txt").read_text(encoding="utf-8").replace("\n", " ")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        corpus_file = str(REPO / "distlaunch/data/corpus.txt")
        subprocess.run(
            [
                sys.executable,
                "-m",
                "distlaunch",
                "data",
                "prepare",
                corpus_file,
                "--out",
                str(tmp / "tok"),
                "--tokenizer",
                "bpe:1000",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            cwd=REPO,
        )
        tokenizer = tmp / "tok" / "tokenizer.json"
        big = tmp / "long.txt"
        repeats = int(args.mb * 2**20 / len(corpus.encode())) + 1
        big.write_text((corpus + " ") * repeats, encoding="utf-8")
        size = big.stat().st_size / 2**20
        prepare = [sys.executable, "-m", "distlaunch", "data", "prepare", str(big), "--out", str(tmp / "out")]
        prepared = peak_of([*prepare, "--tokenizer", str(tokenizer)])
        whole = peak_of([sys.executable, "-c", WHOLE, str(tokenizer), str(big)])
    print(f"one document of {size:.1f} MiB on one line, byte-level BPE (1000 tokens)")
    print(f"distlaunch data prepare   peak {prepared[0]:8.0f} MiB   {prepared[1]:6.1f} s")
    print(f"encoded whole (before)    peak {whole[0]:8.0f} MiB   {whole[1]:6.1f} s")
    print(f"ratio prepare / whole     peak {prepared[0] / whole[0]:8.3f}       {prepared[1] / whole[1]:6.3f}")


if __name__ == "__main__":
    main()
