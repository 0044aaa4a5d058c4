#!/usr/bin/env python3
"""Puts flash_attn v2.8.3's tests/test_flash_attn.py into tests/fa_compat/.cache/ (ignored by
git; nothing of flash_attn is kept in this repository): taken from the flash-attn 2.8.3 source
distribution on the package index, the archive checked against the sha256 the index gives for
it, the file against its own. Prints the file's path; exits 2 with a one-line reason when the
file cannot be had (offline), so that callers can skip.
    python3 tests/fa_compat/fetch.py
"""
import hashlib
import io
import os
import re
import sys
import tarfile
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
CACHE = os.path.join(HERE, ".cache")
TARGET = os.path.join(CACHE, "test_flash_attn.py")
INDEX = "https://pypi.org/simple/flash-attn/"
SDIST = "flash_attn-2.8.3.tar.gz"
SDIST_SHA256 = "1e71dd64a9e0280e0447b8a0c2541bad4bf6ac65bdeaa2f90e51a9e57de0370d"
MEMBER = "flash_attn-2.8.3/tests/test_flash_attn.py"
FILE_SHA256 = "81b462f864efa01bdd31e826339b881754f03822f65d39ad9a1351da6abd2ba0"


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def cached():
    if os.path.exists(TARGET):
        with open(TARGET, "rb") as f:
            if sha256(f.read()) == FILE_SHA256:
                return TARGET
    return None


def fetch():
    html = urllib.request.urlopen(INDEX, timeout=30).read().decode()
    urls = [u for u in re.findall(r'href="([^"]+)"', html) if u.split("#")[0].endswith("/" + SDIST)]
    if not urls:
        raise OSError(f"{SDIST} is not listed on {INDEX}")
    data = urllib.request.urlopen(urls[0].split("#")[0], timeout=120).read()
    if sha256(data) != SDIST_SHA256:
        raise OSError(f"{SDIST}: sha256 {sha256(data)}, want {SDIST_SHA256}")
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        body = tar.extractfile(MEMBER).read()
    if sha256(body) != FILE_SHA256:
        raise OSError(f"{MEMBER}: sha256 {sha256(body)}, want {FILE_SHA256}")
    os.makedirs(CACHE, exist_ok=True)
    with open(TARGET + ".tmp", "wb") as f:
        f.write(body)
    os.replace(TARGET + ".tmp", TARGET)
    return TARGET


def main():
    try:
        print(cached() or fetch())
    except OSError as e:  # (urllib's errors are OSErrors)
        print(f"fa_compat: flash_attn's test file is not cached and cannot be fetched ({e})",
              file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
