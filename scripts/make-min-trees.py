#!/usr/bin/env python3
"""Writes configs/graph/min-trees.jsonl, the graph-data example (docs/graph-attention.md).

Each line is a random tree of 8-20 nodes, one digit per node: a leaf's digit is drawn uniformly,
an inner node's digit is the smallest of its children's. The nodes are listed in a random order,
so where a node sits in the sequence says nothing about the tree: only the edges (parent, child)
do. A masked model that reads the edges can find a hidden inner node as the minimum of its
neighbours below it; one that reads the sequence alone cannot tell which digits those are.

Usage: python3 scripts/make-min-trees.py [N_EXAMPLES (2000)] [SEED (0)] > configs/graph/min-trees.jsonl
(the shipped file is the defaults' output)
"""
import json
import random
import sys


def tree(rng):
    n = rng.randint(8, 20)
    parent = [None] + [rng.randrange(i) for i in range(1, n)]
    children = [[] for _ in range(n)]
    for child, p in enumerate(parent):
        if p is not None:
            children[p].append(child)
    digit = [None] * n
    # children have larger indices than their parent: fill from the last node back
    for v in reversed(range(n)):
        digit[v] = rng.randrange(10) if not children[v] else min(digit[c] for c in children[v])
    order = list(range(n))
    rng.shuffle(order)
    at = {v: i for i, v in enumerate(order)}
    nodes = [str(digit[v]) for v in order]
    edges = [[at[parent[v]], at[v]] for v in range(1, n)]
    return {"nodes": nodes, "edges": edges}


def main():
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    rng = random.Random(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    for _ in range(count):
        print(json.dumps(tree(rng), separators=(",", ":")))


if __name__ == "__main__":
    main()
