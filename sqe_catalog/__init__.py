"""sqe-catalog: the bundled Iceberg REST catalog (Polaris dialect) with STS credential vending."""

__version__ = "0.1.0"
