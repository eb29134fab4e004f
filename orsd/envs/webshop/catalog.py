"""The shop's seeded catalog: products, WebShop-style goals and their train/dev/test splits.

Everything is drawn from `random.Random` seeded with strings built from the seed, so the same
seed gives the same catalog and goals on every machine. A catalog is immutable and shared by
every env (and fork) built with the same arguments (`get_catalog` caches it).
"""

from __future__ import annotations

import functools
import random
import re
import string
from dataclasses import asdict, dataclass, field
from typing import Any

from orsd.envs.webshop import vocab

#: WebShop draws price bounds from multiples of 10 (its PRICE_RANGE)
PRICE_STEPS = tuple(10.0 * i for i in range(1, 100))
#: price bound of a goal whose instruction names none (WebShop's value)
NO_PRICE_BOUND = 1_000_000.0
#: size of each held-out split (dev, test), as in WebShop's 500-goal test set
EVAL_SPLIT_SIZE = 500
_ACRONYMS = {"usb", "led", "hdmi", "4k", "gan"}
_TOKEN = re.compile(r"[a-z0-9]+")


@dataclass(frozen=True)
class Product:
    """One catalog product with the fields WebShop's scoring reads."""

    asin: str
    type_key: str
    category: str
    path: tuple[str, ...]
    query: str
    title: str
    brand: str
    price: float
    rating: float
    attributes: tuple[str, ...]
    options: tuple[tuple[str, tuple[str, ...]], ...]
    bullet_points: tuple[str, ...]
    description: str
    reviews: tuple[tuple[int, str], ...]

    @property
    def product_category(self) -> str:
        """The category path as WebShop writes it (segments joined by `›`)."""
        return " › ".join(self.path)

    def option_group(self, value: str) -> str | None:
        """The option group that offers `value` (exact text), or None."""
        for name, values in self.options:
            if value in values:
                return name
        return None


@dataclass(frozen=True)
class Goal:
    """What an instruction asks for, in WebShop's goal fields (`name` is the target's title)."""

    asin: str
    category: str
    query: str
    name: str
    product_category: str
    instruction_text: str
    attributes: tuple[str, ...]
    goal_options: tuple[tuple[str, str], ...]
    price_upper: float
    search_text: str

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (tuples become lists)."""
        data = asdict(self)
        data["attributes"] = list(self.attributes)
        data["goal_options"] = [list(pair) for pair in self.goal_options]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Goal":
        """Inverse of `to_dict`."""
        fields = dict(data)
        fields["attributes"] = tuple(fields["attributes"])
        fields["goal_options"] = tuple((str(k), str(v)) for k, v in fields["goal_options"])
        fields["price_upper"] = float(fields["price_upper"])
        return cls(**fields)


@dataclass(frozen=True)
class Catalog:
    """Products, goals per split and the noun lexicon used by the type score."""

    seed: int
    num_products: int
    goals_per_product: int
    products: tuple[Product, ...]
    goals: dict[str, tuple[Goal, ...]]
    noun_lexicon: frozenset[str]
    by_asin: dict[str, Product] = field(repr=False)

    def title_nouns(self, title: str) -> tuple[str, ...]:
        """The nouns of a title: its lower-cased words found in the catalog's noun lexicon.

        Stands in for WebShop's spaCy NOUN/PROPN tagging (spaCy models cannot be downloaded
        here); the lexicon holds every product-type noun and every brand name.
        """
        return tuple(dict.fromkeys(w for w in tokenize(title) if w in self.noun_lexicon))


def tokenize(text: str) -> list[str]:
    """Lower-cased alphanumeric words (`clip-in` → `clip`, `in`)."""
    return _TOKEN.findall(text.lower())


def _title_case(phrase: str) -> str:
    words = []
    for word in phrase.split():
        if word in _ACRONYMS:
            words.append(word.upper())
        else:
            words.append("-".join(part[:1].upper() + part[1:] for part in word.split("-")))
    return " ".join(words)


def _join_words(items: list[str]) -> str:
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + " and " + items[-1]


def _make_asin(rng: random.Random, taken: set[str]) -> str:
    alphabet = string.ascii_uppercase + string.digits
    while True:
        asin = "B0" + "".join(rng.choice(alphabet) for _ in range(8))
        if asin not in taken:
            taken.add(asin)
            return asin


_BULLET_TAILS = (
    "a detail our customers ask for.",
    "designed with care and checked before shipping.",
    "one more reason to choose {brand}.",
)


def _make_product(rng: random.Random, ptype: vocab.ProductType, asin: str) -> Product:
    brand = rng.choice(vocab.BRANDS[ptype.category])
    picked = set(rng.sample(range(len(ptype.attributes)), 3))
    attributes = tuple(a for i, a in enumerate(ptype.attributes) if i in picked)
    options = []
    for name, values in ptype.options:
        count = rng.randint(min(2, len(values)), len(values))
        chosen = set(rng.sample(range(len(values)), count))
        options.append((name, tuple(v for i, v in enumerate(values) if i in chosen)))
    low, high = ptype.price_range
    price = max(round(rng.uniform(low, high)) - 0.01, 0.99)
    title = (
        f"{brand} {rng.choice(ptype.descriptors)} {_title_case(ptype.phrase)}"
        f" - {_title_case(rng.choice(attributes))}"
    )
    bullets = tuple(
        f"{a.upper()}: {rng.choice(_BULLET_TAILS).format(brand=brand)}" for a in attributes
    ) + (rng.choice(vocab.FILLER_BULLETS).format(phrase=ptype.phrase),)
    description = (
        rng.choice(vocab.DESCRIPTION_OPENERS).format(brand=brand, phrase=ptype.phrase)
        + f" Highlights: {_join_words(list(attributes))}."
    )
    reviews = tuple(
        (rng.randint(3, 5), text) for text in rng.sample(vocab.REVIEW_TEXTS, 2)
    )
    return Product(
        asin=asin, type_key=ptype.key, category=ptype.category, path=ptype.path,
        query=ptype.query, title=title, brand=brand, price=float(price),
        rating=round(rng.uniform(3.0, 5.0), 1), attributes=attributes, options=tuple(options),
        bullet_points=bullets, description=description, reviews=reviews,
    )


def price_bound(rng: random.Random, price: float) -> float:
    """WebShop's rule: the larger of two draws among the 4 multiples of 10 above the price."""
    above = [p for p in PRICE_STEPS if p > price][:4]
    if len(above) < 2:
        return NO_PRICE_BOUND
    return max(rng.sample(above, 2))


def _make_goal(rng: random.Random, product: Product, ptype: vocab.ProductType) -> Goal:
    count = min(rng.choices((1, 2, 3), weights=(3, 5, 2))[0], len(product.attributes))
    picked = set(rng.sample(range(len(product.attributes)), count))
    attributes = tuple(a for i, a in enumerate(product.attributes) if i in picked)
    goal_options = tuple((name, rng.choice(values)) for name, values in product.options)
    price_upper = price_bound(rng, product.price)
    template = rng.choice(vocab.INSTRUCTION_TEMPLATES)
    attributes_text = _join_words(list(attributes))
    following = attributes_text if "{article}{attributes}" in template else ptype.phrase
    article = "" if ptype.plural else ("an " if following[0] in "aeiou" else "a ")
    text = template.format(article=article, phrase=ptype.phrase, attributes=attributes_text)
    if goal_options:
        text += " with " + ", and ".join(f"{name}: {value}" for name, value in goal_options)
    if price_upper != NO_PRICE_BOUND:
        text += f", and price lower than {price_upper:.2f} dollars"
    return Goal(
        asin=product.asin, category=product.category, query=product.query, name=product.title,
        product_category=product.product_category, instruction_text=text,
        attributes=attributes, goal_options=goal_options, price_upper=price_upper,
        search_text=" ".join(attributes) + " " + ptype.phrase,
    )


def build_catalog(seed: int, num_products: int, goals_per_product: int) -> Catalog:
    """Generate `num_products` products (types assigned round-robin) and their goals."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {seed!r}")
    if isinstance(num_products, bool) or not isinstance(num_products, int) or num_products < len(
        vocab.PRODUCT_TYPES
    ):
        raise ValueError(
            f"num_products must be an int >= {len(vocab.PRODUCT_TYPES)} (one per product type), "
            f"got {num_products!r}"
        )
    if isinstance(goals_per_product, bool) or not isinstance(goals_per_product, int) or not (
        1 <= goals_per_product <= 10
    ):
        raise ValueError(f"goals_per_product must be an int in [1, 10], got {goals_per_product!r}")
    rng = random.Random(f"orsd-webshop-products-{seed}")
    types = vocab.PRODUCT_TYPES
    order = [types[i % len(types)] for i in range(num_products)]
    rng.shuffle(order)
    taken: set[str] = set()
    products = tuple(_make_product(rng, ptype, _make_asin(rng, taken)) for ptype in order)
    type_by_key = {t.key: t for t in types}

    goal_rng = random.Random(f"orsd-webshop-goals-{seed}")
    all_goals: list[Goal] = []
    for product in products:
        seen: set[tuple] = set()
        for _ in range(goals_per_product * 10):
            goal = _make_goal(goal_rng, product, type_by_key[product.type_key])
            key = (goal.attributes, goal.goal_options)
            if key not in seen:
                seen.add(key)
                all_goals.append(goal)
            if len(seen) == goals_per_product:
                break
    random.Random(f"orsd-webshop-splits-{seed}").shuffle(all_goals)
    held_out = min(EVAL_SPLIT_SIZE, len(all_goals) // 10)
    goals = {
        "test": tuple(all_goals[:held_out]),
        "dev": tuple(all_goals[held_out:2 * held_out]),
        "train": tuple(all_goals[2 * held_out:]),
    }
    lexicon = {noun for t in types for noun in t.nouns}
    lexicon |= {brand.lower() for brands in vocab.BRANDS.values() for brand in brands}
    return Catalog(
        seed=seed, num_products=num_products, goals_per_product=goals_per_product,
        products=products, goals=goals, noun_lexicon=frozenset(lexicon),
        by_asin={p.asin: p for p in products},
    )


@functools.lru_cache(maxsize=4)
def get_catalog(seed: int, num_products: int, goals_per_product: int) -> Catalog:
    """`build_catalog`, built once per argument set and shared."""
    return build_catalog(seed, num_products, goals_per_product)
