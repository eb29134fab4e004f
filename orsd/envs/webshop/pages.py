"""The shop's pages: the navigation state, what each page shows, and what can be clicked.

Pages are rendered like WebShop's `text` observation mode: the visible texts of the page joined
by ` [SEP] `, clickable texts shown as plain text, search results as id, title and price.
"""

from __future__ import annotations

from dataclasses import dataclass

from orsd.envs.webshop.catalog import Catalog, Product

SEP = " [SEP] "
SEARCH, RESULTS, ITEM, DETAIL, DONE = "search", "results", "item", "detail", "done"
BACK_TO_SEARCH, PREV, NEXT, BUY_NOW = "Back to Search", "< Prev", "Next >", "Buy Now"
DETAIL_PAGES = ("Description", "Features", "Reviews")


@dataclass(frozen=True)
class PageState:
    """Where the agent is: page kind, search query (lower-cased, single-spaced), results page
    number, product, detail page and the chosen options ((group, value) in the product's order).
    Two equal states show the same page with the same choices."""

    page: str
    query: str = ""
    page_number: int = 1
    asin: str = ""
    detail: str = ""
    options: tuple[tuple[str, str], ...] = ()


def click_key(text: str) -> str:
    """How a click argument is compared with a clickable: lower-cased, all whitespace removed."""
    return "".join(text.lower().split())


def results_on_page(results: tuple[str, ...], page_number: int, per_page: int) -> tuple[str, ...]:
    start = (page_number - 1) * per_page
    return results[start:start + per_page]


def num_pages(results: tuple[str, ...], per_page: int) -> int:
    return max(1, -(-len(results) // per_page))


def clickables(
    state: PageState, catalog: Catalog, results: tuple[str, ...], per_page: int
) -> list[str]:
    """The clickable texts of the page (WebShop's `get_available_actions()['clickables']`)."""
    if state.page == RESULTS:
        labels = [BACK_TO_SEARCH]
        if state.page_number > 1:
            labels.append(PREV)
        if state.page_number < num_pages(results, per_page):
            labels.append(NEXT)
        return labels + list(results_on_page(results, state.page_number, per_page))
    if state.page == ITEM:
        product = catalog.by_asin[state.asin]
        values = [value for _, values in product.options for value in values]
        return [BACK_TO_SEARCH, PREV, *values, *DETAIL_PAGES, BUY_NOW]
    if state.page == DETAIL:
        return [BACK_TO_SEARCH, PREV]
    return []


def render_search(instruction: str) -> str:
    return SEP.join(("WebShop", "Instruction:", instruction, "Search"))


def render_results(
    state: PageState, catalog: Catalog, results: tuple[str, ...], per_page: int
) -> str:
    parts = [BACK_TO_SEARCH, f"Page {state.page_number} (Total results: {len(results)})"]
    if state.page_number > 1:
        parts.append(PREV)
    if state.page_number < num_pages(results, per_page):
        parts.append(NEXT)
    for asin in results_on_page(results, state.page_number, per_page):
        product = catalog.by_asin[asin]
        parts += [asin, product.title, f"${product.price:.2f}"]
    return SEP.join(parts)


def render_item(product: Product) -> str:
    parts = [BACK_TO_SEARCH, PREV]
    for name, values in product.options:
        parts += [name, *values]
    parts += [product.title, f"Price: ${product.price:.2f}", f"Rating: {product.rating:.1f}"]
    parts += [*DETAIL_PAGES, BUY_NOW]
    return SEP.join(parts)


def render_detail(product: Product, detail: str) -> str:
    if detail == "Description":
        body = [product.description]
    elif detail == "Features":
        body = list(product.bullet_points)
    else:
        body = [f"{stars} out of 5 stars: {text}" for stars, text in product.reviews]
    return SEP.join([BACK_TO_SEARCH, PREV, *body])


def render_done(product: Product, options: tuple[tuple[str, str], ...]) -> str:
    """The end page. Unlike WebShop's it does not show the score: transcripts are shown to the
    rubric writer, which must never see rewards."""
    chosen = ", ".join(f"{name}: {value}" for name, value in options) or "none"
    return SEP.join(("Thank you for shopping with us!", f"Purchased: {product.asin}",
                     f"Options: {chosen}"))


def render(state: PageState, catalog: Catalog, results: tuple[str, ...], per_page: int,
           instruction: str) -> str:
    """The observation of `state`."""
    if state.page == SEARCH:
        return render_search(instruction)
    if state.page == RESULTS:
        return render_results(state, catalog, results, per_page)
    product = catalog.by_asin[state.asin]
    if state.page == ITEM:
        return render_item(product)
    if state.page == DETAIL:
        return render_detail(product, state.detail)
    return render_done(product, state.options)
