"""Page hash chain: known answers computed independently, chaining, partial pages, bad input."""

import hashlib
import struct

import pytest

from hicache.memory.hashing import page_hashes


def _reference(tokens, page_size, prior=b""):
    out, prev = [], prior
    for start in range(0, len(tokens) // page_size * page_size, page_size):
        page = b"".join(struct.pack("<I", t) for t in tokens[start : start + page_size])
        prev = hashlib.sha256(prev + page).digest()
        out.append(prev.hex())
    return out


def test_known_answer_first_page():
    tokens = [1, 2, 3, 4]
    expected = hashlib.sha256(struct.pack("<IIII", 1, 2, 3, 4)).hexdigest()
    assert page_hashes(tokens, 4) == [expected]


def test_known_answer_literal_chain():
    """Digests written out as literals (hashlib over hand-laid little-endian bytes), so a
    wrong byte order or chaining rule cannot hide behind a reference that shares it."""
    tokens = [1, 2, 256, 2**32 - 1, 5, 65536, 7, 2**24]
    first = "a33d3bc32a1a1afc621c8e28607884e977bb9f3ac7c8eed187d95d5e1b232773"
    second = "606c194175d13dcbcd50a5146a9079e9730b285611e912114d794e4a7af8b414"
    assert hashlib.sha256(bytes([1, 0, 0, 0, 2, 0, 0, 0, 0, 1, 0, 0, 255, 255, 255, 255])
                          ).hexdigest() == first
    assert page_hashes(tokens, 4) == [first, second]
    assert page_hashes(tokens[4:], 4, prior=first) == [second]


def test_matches_reference_chain():
    tokens = [(i * 7919) % 50000 for i in range(256)] + [2**32 - 1] * 64
    assert page_hashes(tokens, 64) == _reference(tokens, 64)
    assert len(page_hashes(tokens, 64)) == 5


def test_chaining_with_prior():
    tokens = list(range(1000, 1256))
    full = page_hashes(tokens, 64)
    tail = page_hashes(tokens[64:], 64, prior=full[0])
    assert tail == full[1:]
    assert page_hashes(tokens[64:], 64) != full[1:]  # without the prior the chain differs


def test_partial_page_ignored():
    tokens = list(range(150))
    assert page_hashes(tokens, 64) == page_hashes(tokens[:128], 64)
    assert page_hashes(tokens[:63], 64) == []
    assert page_hashes([], 64) == []


@pytest.mark.parametrize("tokens", [[-1, 0], [0, 2**32]])
def test_out_of_range_tokens(tokens):
    with pytest.raises(ValueError):
        page_hashes(tokens, 2)


@pytest.mark.parametrize("page_size", [0, -4])
def test_bad_page_size(page_size):
    with pytest.raises(ValueError):
        page_hashes([1, 2, 3], page_size)
