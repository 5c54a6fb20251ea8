"""Drafters that copy from text already seen: prompt lookup (ngram), suffix indexes (suffix), and lookahead
decoding's n-gram pool (lookahead, on Jacobi iterations: jacobi)."""
