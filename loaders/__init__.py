"""PyTorch loaders: arrive with their own issue."""
