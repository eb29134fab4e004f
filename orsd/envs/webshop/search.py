"""BM25 search over the catalog (`rank_bm25.BM25Okapi`), built once per catalog and shared.

A product's document is its title, search query, attributes and option values. WebShop
searches a Lucene (pyserini) BM25 index over title, description, bullet points and options;
the ranking function is the same family, the fields differ slightly (documented).
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict

import numpy as np
from rank_bm25 import BM25Okapi

from orsd.envs.webshop.catalog import Catalog, Product, get_catalog, tokenize

#: WebShop shows at most 50 results, 10 per page
MAX_RESULTS = 50
_STOPWORDS = frozenset(
    "a an and are as at be by for from i in is it me of on or that the this to want was with "
    "need looking find buy am which lower than price dollars".split()
)
_CACHE_SIZE = 4096


def search_terms(text: str) -> list[str]:
    """The words BM25 sees: lower-cased alphanumeric tokens without stop words."""
    return [w for w in tokenize(text) if w not in _STOPWORDS]


def product_document(product: Product) -> list[str]:
    """The indexed words of one product."""
    values = " ".join(v for _, vals in product.options for v in vals)
    text = f"{product.title} {product.query} {' '.join(product.attributes)} {values}"
    return search_terms(text)


class SearchIndex:
    """Ranks catalog products for a query; thread-safe, with a bounded result cache."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self._asins = [p.asin for p in catalog.products]
        self._bm25 = BM25Okapi([product_document(p) for p in catalog.products])
        self._cache: OrderedDict[tuple[str, ...], tuple[str, ...]] = OrderedDict()
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        # picklable for worker processes: the lock and the cache stay behind
        state = dict(self.__dict__)
        del state["_lock"], state["_cache"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._cache = OrderedDict()
        self._lock = threading.Lock()

    def search(self, query: str, limit: int = MAX_RESULTS) -> tuple[str, ...]:
        """ASINs of the best-scoring products (score > 0), best first, ties by catalog order."""
        terms = tuple(search_terms(query))
        if not terms:
            return ()
        with self._lock:
            hit = self._cache.get(terms)
            if hit is not None:
                self._cache.move_to_end(terms)
                return hit[:limit]
        scores = self._bm25.get_scores(list(terms))
        order = np.argsort(-scores, kind="stable")[:MAX_RESULTS]
        result = tuple(self._asins[i] for i in order if scores[i] > 0)
        with self._lock:
            self._cache[terms] = result
            if len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)
        return result[:limit]


@functools.lru_cache(maxsize=4)
def get_index(seed: int, num_products: int, goals_per_product: int) -> SearchIndex:
    """The shared index of `get_catalog(seed, num_products, goals_per_product)`."""
    return SearchIndex(get_catalog(seed, num_products, goals_per_product))
