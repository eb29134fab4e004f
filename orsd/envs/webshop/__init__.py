"""The shop: a generated WebShop-style catalog with the official scorer (env.py, catalog.py,
pages.py, search.py, scoring.py, vocab.py), and an adapter for an installed WebShop (real.py)."""

from orsd.envs.webshop.env import WebShopEnv

__all__ = ["WebShopEnv"]
