"""The word lists the shop's catalog is generated from: categories, product types, brands.

Product types follow WebShop's five top categories (beauty, fashion, electronics, grocery, home).
Each type lists its Amazon-style category path, search query, the noun phrase used in titles and
instructions, the nouns of that phrase (our stand-in for spaCy's POS tags in the type score),
attributes, option groups and a price range. Lists are chosen so the official fuzzy matching
(token-set ratio > 85) tells any two attributes of a type, and any two option values of a type,
apart (checked by tests/envs/test_webshop_catalog.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProductType:
    """One kind of product, e.g. a shampoo, with everything its products are drawn from."""

    key: str
    category: str
    path: tuple[str, ...]
    query: str
    phrase: str
    nouns: tuple[str, ...]
    attributes: tuple[str, ...]
    options: tuple[tuple[str, tuple[str, ...]], ...]
    price_range: tuple[float, float]
    descriptors: tuple[str, ...]
    plural: bool = False


SIZES = ("small", "medium", "large", "xl", "xxl")
SHOE_SIZES = ("7", "8", "9", "10", "11", "12")
BASIC_COLORS = (
    "black", "white", "navy", "grey", "red", "green", "beige", "pink", "purple", "brown",
)
DEVICE_COLORS = ("black", "white", "blue", "red", "silver", "pink")

# Colour names WebShop-style colour normalisation looks for (first one found wins, like
# WebShop's normalize_color); our own list, covering every colour the catalog uses.
COLOR_SET = (
    "black", "white", "navy", "blue", "grey", "gray", "red", "green", "beige", "pink", "purple",
    "brown", "blonde", "auburn", "coral", "burgundy", "nude", "silver", "gold", "rose", "yellow",
    "orange", "ivory", "teal", "walnut", "oak", "charcoal", "olive", "khaki", "turquoise",
)

BRANDS = {
    "beauty": ("Lumina", "Velora", "Aurelle", "Bellamy", "Sorelle", "Mirabel", "Petalia",
               "Glowen", "Cremora", "Silkari"),
    "fashion": ("Northway", "Fennick", "Marlowe", "Tessaro", "Brindle", "Calloway", "Dunmore",
                "Halden", "Korvin", "Solstead"),
    "electronics": ("Voltrix", "Nexora", "Ampliq", "Zentra", "Qubex", "Sonaro", "Cirrex",
                    "Tekvane", "Ohmix", "Lumetra"),
    "grocery": ("Orchardly", "Graindale", "Bramblewood", "Sunmeadow", "Oakhollow", "Pantrico",
                "Verdeli", "Honeyfield", "Saltmarsh", "Fernbrook"),
    "home": ("Hearthwell", "Loomis", "Oakridge", "Cozette", "Dwellio", "Nestory", "Birchway",
             "Calmora", "Linnea", "Woodhaven"),
}

_BEAUTY = "Beauty & Personal Care"
_FASHION = "Clothing, Shoes & Jewelry"
_ELECTRONICS = "Electronics"
_GROCERY = "Grocery & Gourmet Food"
_HOME = "Home & Kitchen"

PRODUCT_TYPES: tuple[ProductType, ...] = (
    # -- beauty ----------------------------------------------------------------------------
    ProductType("hair_extension", "beauty", (_BEAUTY, "Hair Care", "Hair Extensions"),
                "hair extensions", "clip-in hair extension", ("hair", "extension"),
                ("natural looking", "heat resistant", "tangle free", "easy to apply",
                 "long lasting", "lightweight"),
                (("color", ("black", "dark brown", "blonde", "auburn", "grey")),
                 ("length", ("16 inch", "24 inch", "30 inch"))),
                (14.0, 70.0), ("Seamless", "Straight", "Wavy", "Silky")),
    ProductType("face_moisturizer", "beauty", (_BEAUTY, "Skin Care", "Face Moisturizers"),
                "face moisturizer", "face moisturizer cream", ("face", "moisturizer", "cream"),
                ("paraben free", "fragrance free", "oil free", "dermatologist tested",
                 "non greasy", "cruelty free"),
                (("size", ("2 oz", "4 oz", "8 oz")),),
                (9.0, 48.0), ("Hydrating", "Daily", "Gentle", "Overnight")),
    ProductType("shampoo", "beauty", (_BEAUTY, "Hair Care", "Shampoo & Conditioner"),
                "shampoo", "shampoo", ("shampoo",),
                ("sulfate free", "color safe", "natural ingredients", "anti dandruff",
                 "volumizing", "moisturizing"),
                (("size", ("8 oz", "16 oz", "32 oz")),
                 ("scent", ("lavender", "coconut", "unscented", "citrus"))),
                (6.0, 36.0), ("Daily", "Gentle", "Clarifying", "Repairing")),
    ProductType("nail_polish", "beauty", (_BEAUTY, "Foot, Hand & Nail Care", "Nail Polish"),
                "nail polish", "nail polish", ("nail", "polish"),
                ("quick drying", "long lasting", "chip resistant", "non toxic", "high gloss",
                 "vegan"),
                (("color", ("red", "pink", "nude", "coral", "burgundy", "black")),),
                (4.0, 22.0), ("Glossy", "Classic", "Salon", "Bold")),
    ProductType("toothbrush", "beauty", (_BEAUTY, "Oral Care", "Electric Toothbrushes"),
                "electric toothbrush", "electric toothbrush", ("toothbrush",),
                ("rechargeable", "waterproof", "2 minute timer", "travel case included",
                 "soft bristles", "whitening mode"),
                (("color", ("white", "black", "pink", "blue")),),
                (19.0, 90.0), ("Sonic", "Smart", "Compact", "Advanced")),
    ProductType("makeup_brush", "beauty", (_BEAUTY, "Tools & Accessories", "Makeup Brushes"),
                "makeup brushes", "makeup brush set", ("makeup", "brush", "set"),
                ("synthetic bristles", "cruelty free", "easy to clean", "travel friendly",
                 "dense", "soft touch"),
                (("color", ("rose gold", "black", "silver")),),
                (8.0, 40.0), ("Professional", "Essential", "Deluxe", "Mini")),
    # -- fashion ---------------------------------------------------------------------------
    ProductType("tshirt", "fashion", (_FASHION, "Men", "Clothing", "T-Shirts"),
                "men t-shirt", "crew neck t-shirt", ("neck", "shirt"),
                ("machine wash", "short sleeve", "moisture wicking", "slim fit", "cotton blend",
                 "tagless"),
                (("size", SIZES), ("color", BASIC_COLORS)),
                (8.0, 35.0), ("Classic", "Everyday", "Soft", "Athletic")),
    ProductType("dress", "fashion", (_FASHION, "Women", "Clothing", "Dresses"),
                "women summer dress", "summer dress", ("dress",),
                ("with pockets", "floral print", "sleeveless", "knee length", "flowy",
                 "breathable fabric"),
                (("size", SIZES), ("color", BASIC_COLORS)),
                (18.0, 65.0), ("Casual", "Boho", "Elegant", "Vintage")),
    ProductType("running_shoe", "fashion", (_FASHION, "Men", "Shoes", "Athletic"),
                "running shoes", "running shoe", ("shoe",),
                ("non slip", "lightweight", "breathable", "arch support", "memory foam",
                 "rubber sole"),
                (("size", SHOE_SIZES), ("color", ("black", "white", "grey", "navy", "red"))),
                (30.0, 120.0), ("Trail", "Road", "Cushioned", "Sport")),
    ProductType("winter_jacket", "fashion", (_FASHION, "Women", "Clothing", "Coats & Jackets"),
                "women winter jacket", "winter jacket", ("jacket",),
                ("water resistant", "hooded", "fleece lined", "windproof", "zipper closure",
                 "packable"),
                (("size", SIZES), ("color", ("black", "navy", "olive", "burgundy", "khaki"))),
                (35.0, 150.0), ("Quilted", "Puffer", "Warm", "Insulated")),
    ProductType("yoga_pants", "fashion", (_FASHION, "Women", "Clothing", "Leggings"),
                "yoga pants", "high waist yoga pants", ("waist", "yoga", "pants"),
                ("tummy control", "squat proof", "four way stretch", "side pockets",
                 "moisture wicking", "quick dry"),
                (("size", SIZES), ("color", ("black", "grey", "navy", "purple", "teal"))),
                (14.0, 48.0), ("Seamless", "Active", "Workout", "Buttery"), plural=True),
    ProductType("wool_socks", "fashion", (_FASHION, "Men", "Clothing", "Socks"),
                "wool socks", "wool socks", ("wool", "socks"),
                ("cushioned", "warm", "anti blister", "reinforced heel", "seamless toe",
                 "odor resistant"),
                (("size", ("small", "medium", "large")),
                 ("color", ("grey", "charcoal", "brown", "olive")),
                 ("pack", ("3 pack", "6 pack"))),
                (9.0, 38.0), ("Hiking", "Thermal", "Crew", "Merino"), plural=True),
    # -- electronics -----------------------------------------------------------------------
    ProductType("earbuds", "electronics",
                (_ELECTRONICS, "Headphones, Earbuds & Accessories", "Earbuds"),
                "wireless earbuds", "wireless earbuds", ("earbuds",),
                ("noise cancelling", "long battery life", "water resistant", "fast charging",
                 "built-in microphone", "touch control"),
                (("color", DEVICE_COLORS),),
                (19.0, 150.0), ("True", "Sport", "Compact", "Pro"), plural=True),
    ProductType("phone_case", "electronics", (_ELECTRONICS, "Cell Phones & Accessories", "Cases"),
                "phone case", "phone case", ("phone", "case"),
                ("shockproof", "slim", "wireless charging compatible", "scratch resistant",
                 "raised bezel", "drop protection"),
                (("color", ("black", "clear", "blue", "pink", "green")),
                 ("model", ("iphone 15", "galaxy s23", "pixel 8"))),
                (7.0, 30.0), ("Rugged", "Thin", "Protective", "Matte")),
    ProductType("usb_charger", "electronics", (_ELECTRONICS, "Computers & Accessories", "Chargers"),
                "usb c charger", "usb c charger", ("charger",),
                ("fast charging", "foldable plug", "overheat protection", "compact",
                 "dual port", "gan technology"),
                (("wattage", ("20w", "30w", "65w")), ("color", ("white", "black"))),
                (10.0, 45.0), ("Wall", "Travel", "Mini", "Power")),
    ProductType("speaker", "electronics",
                (_ELECTRONICS, "Portable Audio & Video", "Portable Speakers"),
                "bluetooth speaker", "portable bluetooth speaker", ("speaker",),
                ("waterproof", "deep bass", "20 hour playtime", "stereo pairing",
                 "built-in microphone", "dustproof"),
                (("color", ("black", "blue", "red", "grey", "green")),),
                (22.0, 130.0), ("Outdoor", "Mini", "Party", "Rugged")),
    ProductType("hdmi_cable", "electronics", (_ELECTRONICS, "Accessories & Supplies", "Cables"),
                "hdmi cable", "hdmi cable", ("cable",),
                ("4k", "high speed", "gold plated", "braided", "ethernet support", "flexible"),
                (("length", ("3 ft", "6 ft", "10 ft", "15 ft")),),
                (5.0, 28.0), ("Premium", "Ultra", "Certified", "Durable")),
    ProductType("mouse", "electronics", (_ELECTRONICS, "Computers & Accessories", "Mice"),
                "wireless mouse", "wireless mouse", ("mouse",),
                ("ergonomic", "silent click", "rechargeable", "adjustable dpi", "usb receiver",
                 "long battery life"),
                (("color", ("black", "white", "grey", "pink", "blue")),),
                (9.0, 60.0), ("Optical", "Portable", "Slim", "Vertical")),
    # -- grocery ---------------------------------------------------------------------------
    ProductType("protein_bar", "grocery", (_GROCERY, "Snack Foods", "Protein Bars"),
                "protein bars", "protein bar", ("protein", "bar"),
                ("gluten free", "low sugar", "high protein", "non gmo", "keto friendly",
                 "plant based"),
                (("flavor", ("chocolate", "peanut butter", "vanilla", "cookie dough")),
                 ("size", ("12 count", "30 count"))),
                (12.0, 45.0), ("Chewy", "Crunchy", "Soft", "Baked")),
    ProductType("coffee", "grocery", (_GROCERY, "Beverages", "Coffee"),
                "ground coffee", "ground coffee", ("coffee",),
                ("organic", "fair trade", "single origin", "low acid", "kosher", "rich aroma"),
                (("roast", ("light roast", "medium roast", "dark roast")),
                 ("size", ("12 oz", "2 lb"))),
                (7.0, 35.0), ("Smooth", "Bold", "Artisan", "Fresh")),
    ProductType("herbal_tea", "grocery", (_GROCERY, "Beverages", "Tea"),
                "herbal tea", "herbal tea", ("tea",),
                ("caffeine free", "organic", "non gmo", "individually wrapped", "kosher",
                 "sugar free"),
                (("flavor", ("chamomile", "peppermint", "ginger", "hibiscus")),
                 ("size", ("16 count", "48 count"))),
                (4.0, 24.0), ("Soothing", "Relaxing", "Calming", "Classic")),
    ProductType("olive_oil", "grocery", (_GROCERY, "Pantry Staples", "Oils"),
                "olive oil", "extra virgin olive oil", ("olive", "oil"),
                ("cold pressed", "organic", "first harvest", "non gmo", "glass bottle", "kosher"),
                (("size", ("250 ml", "500 ml", "1 liter")),),
                (8.0, 55.0), ("Mediterranean", "Pure", "Premium", "Fruity")),
    ProductType("dried_fruit", "grocery", (_GROCERY, "Snack Foods", "Dried Fruit"),
                "dried fruit", "dried fruit snack", ("fruit", "snack"),
                ("no sugar added", "vegan", "gluten free", "resealable bag", "non gmo",
                 "unsulfured"),
                (("flavor", ("mango", "apple", "apricot", "cherry")),
                 ("size", ("8 oz", "2 lb"))),
                (5.0, 32.0), ("Chewy", "Natural", "Sweet", "Tropical")),
    ProductType("hot_sauce", "grocery", (_GROCERY, "Condiments", "Hot Sauce"),
                "hot sauce", "hot sauce", ("sauce",),
                ("no preservatives", "gluten free", "small batch", "vegan", "low sodium",
                 "fermented"),
                (("flavor", ("habanero", "chipotle", "garlic", "jalapeno")),
                 ("size", ("5 oz", "12 oz"))),
                (4.0, 26.0), ("Fiery", "Smoky", "Tangy", "Classic")),
    # -- home ------------------------------------------------------------------------------
    ProductType("pillow_cover", "home", (_HOME, "Bedding", "Decorative Pillows"),
                "throw pillow covers", "throw pillow cover", ("pillow", "cover"),
                ("hidden zipper", "machine washable", "double sided", "fade resistant",
                 "velvet", "set of 2"),
                (("color", ("beige", "grey", "navy", "green", "pink", "mustard")),
                 ("size", ("18 x 18 inch", "20 x 20 inch"))),
                (8.0, 36.0), ("Decorative", "Cozy", "Modern", "Farmhouse")),
    ProductType("office_chair", "home",
                (_HOME, "Furniture", "Home Office Furniture", "Office Chairs"),
                "office chair", "ergonomic office chair", ("office", "chair"),
                ("lumbar support", "adjustable height", "breathable mesh", "swivel",
                 "padded armrests", "easy assembly"),
                (("color", ("black", "grey", "white", "blue")),),
                (60.0, 260.0), ("Executive", "Task", "Mesh", "Modern")),
    ProductType("bookshelf", "home", (_HOME, "Furniture", "Living Room Furniture", "Bookcases"),
                "bookshelf", "bookshelf", ("bookshelf",),
                ("easy assembly", "solid wood", "wall anchor", "adjustable shelves",
                 "industrial style", "open back"),
                (("color", ("white", "black", "walnut", "oak")), ("size", ("3 tier", "5 tier"))),
                (40.0, 200.0), ("Tall", "Narrow", "Ladder", "Modern")),
    ProductType("towel_set", "home", (_HOME, "Bath", "Towels"),
                "bath towels", "bath towel set", ("bath", "towel", "set"),
                ("quick dry", "highly absorbent", "100 cotton", "machine washable",
                 "oeko tex certified", "plush"),
                (("color", ("white", "grey", "navy", "beige", "teal")),
                 ("pieces", ("4 piece", "12 piece"))),
                (18.0, 75.0), ("Luxury", "Hotel", "Soft", "Spa")),
    ProductType("desk_lamp", "home", (_HOME, "Lighting", "Lamps"),
                "led desk lamp", "led desk lamp", ("desk", "lamp"),
                ("dimmable", "usb charging port", "eye caring", "touch control",
                 "adjustable arm", "energy efficient"),
                (("color", ("black", "white", "silver")),),
                (15.0, 70.0), ("Modern", "Foldable", "Reading", "Study")),
    ProductType("candle", "home", (_HOME, "Home Decor", "Candles"),
                "scented candle", "scented candle", ("candle",),
                ("soy wax", "long burning", "lead free wick", "gift ready", "non toxic",
                 "hand poured"),
                (("scent", ("lavender", "vanilla", "sandalwood", "eucalyptus")),
                 ("size", ("8 oz", "16 oz"))),
                (9.0, 45.0), ("Aromatherapy", "Rustic", "Relaxing", "Cozy")),
)

CATEGORIES = tuple(dict.fromkeys(t.category for t in PRODUCT_TYPES))

# Neutral text used in bullet points, descriptions and reviews; it must not contain any
# attribute phrase (so only a product's own attributes can match by the text fallback).
FILLER_BULLETS = (
    "SATISFACTION GUARANTEE: contact our team with any question about your order.",
    "WHAT YOU GET: one {phrase} as pictured, ready to use.",
    "THOUGHTFUL DESIGN: made for everyday use at home or on the go.",
)
DESCRIPTION_OPENERS = (
    "Meet the {brand} {phrase}.",
    "The {brand} {phrase} is made for everyday use.",
    "Discover the {brand} {phrase}, a customer favourite.",
)
REVIEW_TEXTS = (
    "Works as described and arrived on time.",
    "Good value for the price, would buy again.",
    "Nice quality, matches the pictures.",
    "Does the job, nothing more to say.",
    "My second purchase from this brand.",
    "Packaging could be better but the product is fine.",
)

INSTRUCTION_TEMPLATES = (
    "i need {article}{phrase} that is {attributes}",
    "i am looking for {article}{attributes} {phrase}",
    "find me {article}{phrase} which is {attributes}",
    "i want to buy {article}{attributes} {phrase}",
)
