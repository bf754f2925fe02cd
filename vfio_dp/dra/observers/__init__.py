"""What the node's state means for the DRA pool, decided purely: ``health`` (the pool by
group state, taints, the health list; design.md's table)."""

__all__ = ["health"]
