"""The read path shared by the loader and the lifecycle commands."""
