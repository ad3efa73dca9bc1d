"""Templates the shipped catalog is generated from (see :mod:`trinity_webshop.generate_catalog`).

Each product type names its WebShop ``category``, the search ``query`` its products were "scraped"
with, the ``product_category`` breadcrumb, the title noun phrase (``noun``), a pool of
attributes, option groups with their values, title suffixes and a price range. Title words that
spaCy would tag NOUN/PROPN are listed explicitly (``noun`` words, ``suffixes[i][1]``, the brand),
so the type reward needs no NLP model at run time.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ProductType:
    """One kind of product: everything the generator varies products of this kind over."""

    category: str
    query: str
    product_category: str
    noun: str
    attributes: tuple[str, ...]
    options: dict[str, tuple[str, ...]]
    price: tuple[float, float]
    # (text appended to the title, the nouns in that text)
    suffixes: tuple[tuple[str, tuple[str, ...]], ...] = field(default=(("", ()),))


BRANDS = (
    "Lumora", "Velaris", "Northpeak", "Bramblewood", "Kestrel", "Orbina", "Solvane", "Trelly",
    "Quillan", "Marlowe", "Zephyra", "Aldergate", "Copperfox", "Halcyon", "Nimbus", "Ostara",
    "Pinecrest", "Rivulet", "Saffra", "Tamsin", "Umbra", "Wrenfield", "Yarrow", "Ashgrove",
)  # fmt: skip

SIZES_FL_OZ = ("8 fl oz", "12 fl oz", "16 fl oz", "32 fl oz")
SIZES_CLOTHES = ("x-small", "small", "medium", "large", "x-large", "xx-large")
SIZES_SHOES = ("6", "7", "8", "9", "10", "11", "12")
COLORS = ("black", "white", "navy blue", "heather grey", "olive green", "burgundy", "beige", "sky blue")

PRODUCT_TYPES: tuple[ProductType, ...] = (
    # -- beauty ---------------------------------------------------------------------------
    ProductType(
        "beauty",
        "shampoo",
        "Beauty & Personal Care › Hair Care › Shampoo & Conditioner › Shampoos",
        "Shampoo",
        ("sulfate free", "paraben free", "natural ingredients", "color safe", "cruelty free", "dry hair"),
        {"size": SIZES_FL_OZ, "scent": ("coconut", "lavender", "argan oil", "tea tree", "unscented")},
        (6.0, 34.0),
        (("for Dry Hair", ("hair",)), ("for Women and Men", ("women", "men"))),
    ),
    ProductType(
        "beauty",
        "deodorant",
        "Beauty & Personal Care › Personal Care › Deodorants & Antiperspirants",
        "Deodorant",
        ("aluminum free", "long lasting", "sensitive skin", "natural ingredients", "travel size"),
        {
            "size": ("2.6 ounce", "3 ounce (pack of 1)", "3 ounce (pack of 2)"),
            "scent": ("bright citrus", "ginger fresh", "calming lavender", "cedar", "unscented"),
        },
        (5.0, 25.0),
        (("for Sensitive Skin", ("skin",)), ("", ())),
    ),
    ProductType(
        "beauty",
        "lipstick",
        "Beauty & Personal Care › Makeup › Lips › Lipstick",
        "Lipstick",
        ("long lasting", "cruelty free", "paraben free", "matte finish", "moisturizing", "vegan"),
        {"color": ("ruby red", "nude pink", "berry", "coral", "mauve", "plum")},
        (4.0, 28.0),
        (("", ()),),
    ),
    ProductType(
        "beauty",
        "face moisturizer",
        "Beauty & Personal Care › Skin Care › Face › Creams & Moisturizers",
        "Face Moisturizer",
        ("oil free", "fragrance free", "hyaluronic acid", "sensitive skin", "spf 30", "non comedogenic"),
        {"size": ("1.7 fl oz", "2.5 fl oz", "4 fl oz")},
        (9.0, 48.0),
        (("for Women", ("women",)), ("with Vitamin C", ("vitamin",))),
    ),
    ProductType(
        "beauty",
        "nail polish",
        "Beauty & Personal Care › Foot, Hand & Nail Care › Nail Polish",
        "Nail Polish",
        ("quick dry", "long lasting", "non toxic", "gel finish", "chip resistant"),
        {"color": ("cherry red", "ballet pink", "midnight blue", "glitter gold", "clear")},
        (3.0, 18.0),
        (("Set", ("set",)), ("", ())),
    ),
    # -- electronics ----------------------------------------------------------------------
    ProductType(
        "electronics",
        "wireless headphones",
        "Electronics › Headphones, Earbuds & Accessories › Headphones",
        "Wireless Headphones",
        ("noise cancelling", "bluetooth 5.0", "long battery life", "foldable", "built-in microphone"),
        {"color": ("black", "white", "rose gold", "midnight blue")},
        (19.0, 149.0),
        (("Over Ear", ("ear",)), ("with Carrying Case", ("case",))),
    ),
    ProductType(
        "electronics",
        "phone case",
        "Cell Phones & Accessories › Cases, Holsters & Sleeves › Basic Cases",
        "Phone Case",
        ("shockproof", "slim fit", "wireless charging compatible", "screen protector", "kickstand"),
        {
            "color": ("clear", "black", "pink", "forest green", "purple"),
            "model": ("iphone 13", "iphone 14", "iphone 15", "galaxy s23"),
        },
        (6.0, 29.0),
        (("for Women and Men", ("women", "men")), ("", ())),
    ),
    ProductType(
        "electronics",
        "usb c cable",
        "Electronics › Computers & Accessories › Cables › USB Cables",
        "USB C Cable",
        ("fast charging", "braided nylon", "data transfer", "durable", "60w power delivery"),
        {"size": ("3 ft", "6 ft", "10 ft"), "color": ("black", "white", "grey")},
        (5.0, 22.0),
        (("2 Pack", ("pack",)), ("", ())),
    ),
    ProductType(
        "electronics",
        "bluetooth speaker",
        "Electronics › Portable Audio & Video › Portable Speakers",
        "Bluetooth Speaker",
        ("waterproof", "portable", "long battery life", "stereo sound", "built-in microphone"),
        {"color": ("black", "ocean blue", "crimson", "camo green")},
        (18.0, 129.0),
        (("for Outdoor Travel", ("travel",)), ("", ())),
    ),
    ProductType(
        "electronics",
        "power bank",
        "Cell Phones & Accessories › Chargers & Power Adapters › Portable Power Banks",
        "Power Bank",
        ("fast charging", "usb c", "led display", "compact", "high capacity"),
        {"capacity": ("10000mah", "20000mah", "26800mah"), "color": ("black", "white")},
        (15.0, 79.0),
        (("Portable Charger", ("charger",)), ("", ())),
    ),
    # -- fashion --------------------------------------------------------------------------
    ProductType(
        "fashion",
        "men t shirt",
        "Clothing, Shoes & Jewelry › Men › Clothing › Shirts › T-Shirts",
        "T-Shirt",
        ("cotton", "short sleeve", "crew neck", "moisture wicking", "machine wash", "regular fit"),
        {"size": SIZES_CLOTHES, "color": COLORS},
        (8.0, 35.0),
        (("for Men", ("men",)), ("", ())),
    ),
    ProductType(
        "fashion",
        "women running shoes",
        "Clothing, Shoes & Jewelry › Women › Shoes › Athletic › Running",
        "Running Shoes",
        ("lightweight", "non slip", "breathable mesh", "arch support", "rubber sole"),
        {"size": SIZES_SHOES, "color": ("black", "white", "pink", "grey", "navy blue")},
        (25.0, 120.0),
        (("for Women", ("women",)), ("", ())),
    ),
    ProductType(
        "fashion",
        "men jeans",
        "Clothing, Shoes & Jewelry › Men › Clothing › Jeans",
        "Jeans",
        ("slim fit", "stretch", "straight leg", "machine wash", "button closure"),
        {
            "size": ("30w x 30l", "32w x 32l", "34w x 32l", "36w x 34l"),
            "color": ("dark wash", "light wash", "black", "grey"),
        },
        (20.0, 80.0),
        (("for Men", ("men",)), ("Denim Pants", ("denim", "pants"))),
    ),
    ProductType(
        "fashion",
        "women summer dress",
        "Clothing, Shoes & Jewelry › Women › Clothing › Dresses › Casual",
        "Summer Dress",
        ("floral print", "v neck", "short sleeve", "pockets", "flowy", "hand wash only"),
        {"size": SIZES_CLOTHES[:5], "color": ("floral blue", "red", "yellow", "black", "green")},
        (16.0, 59.0),
        (("for Women", ("women",)), ("", ())),
    ),
    ProductType(
        "fashion",
        "wool socks",
        "Clothing, Shoes & Jewelry › Men › Clothing › Socks › Casual",
        "Wool Socks",
        ("merino wool", "cushioned", "moisture wicking", "warm", "hiking"),
        {"size": ("medium", "large", "x-large"), "color": ("grey", "charcoal", "brown", "multicolor")},
        (9.0, 32.0),
        (("6 Pairs", ("pairs",)), ("for Men and Women", ("men", "women"))),
    ),
    # -- grocery --------------------------------------------------------------------------
    ProductType(
        "grocery",
        "ground coffee",
        "Grocery & Gourmet Food › Beverages › Coffee, Tea & Cocoa › Coffee › Ground Coffee",
        "Ground Coffee",
        ("organic", "medium roast", "dark roast", "fair trade", "decaf", "whole bean"),
        {
            "size": ("12 ounce (pack of 1)", "12 ounce (pack of 2)", "2 pound"),
            "flavor": ("original", "vanilla", "hazelnut", "french roast"),
        },
        (7.0, 39.0),
        (("", ()),),
    ),
    ProductType(
        "grocery",
        "green tea",
        "Grocery & Gourmet Food › Beverages › Coffee, Tea & Cocoa › Tea › Green",
        "Green Tea",
        ("organic", "caffeine free", "non gmo", "individually wrapped", "loose leaf"),
        {"size": ("20 count", "40 count", "100 count"), "flavor": ("jasmine", "mint", "lemon", "matcha")},
        (4.0, 24.0),
        (("Bags", ("bags",)), ("", ())),
    ),
    ProductType(
        "grocery",
        "protein bars",
        "Grocery & Gourmet Food › Snacks › Bars › Protein Bars",
        "Protein Bars",
        ("gluten free", "low sugar", "high protein", "keto friendly", "plant based"),
        {
            "flavor": ("chocolate peanut butter", "cookie dough", "almond", "berry"),
            "size": ("12 count", "24 count"),
        },
        (12.0, 45.0),
        (("Snack", ("snack",)), ("", ())),
    ),
    ProductType(
        "grocery",
        "roasted almonds",
        "Grocery & Gourmet Food › Snacks › Nuts & Seeds › Almonds",
        "Roasted Almonds",
        ("unsalted", "lightly salted", "non gmo", "resealable bag", "kosher"),
        {"size": ("16 ounce", "32 ounce", "3 pound")},
        (8.0, 36.0),
        (("Nuts", ("nuts",)), ("", ())),
    ),
    ProductType(
        "grocery",
        "pasta sauce",
        "Grocery & Gourmet Food › Pantry Staples › Sauces › Pasta Sauces",
        "Pasta Sauce",
        ("no sugar added", "organic", "vegan", "gluten free", "low sodium"),
        {"flavor": ("marinara", "tomato basil", "arrabbiata", "garlic"), "size": ("24 ounce", "2 pack")},
        (4.0, 21.0),
        (("", ()),),
    ),
    # -- furniture / home -----------------------------------------------------------------
    ProductType(
        "furniture",
        "office chair",
        "Home & Kitchen › Furniture › Home Office Furniture › Home Office Chairs",
        "Office Chair",
        ("ergonomic", "lumbar support", "adjustable height", "mesh back", "easy assembly"),
        {"color": ("black", "grey", "white", "blue")},
        (59.0, 299.0),
        (("with Wheels", ("wheels",)), ("Desk Chair", ("desk", "chair"))),
    ),
    ProductType(
        "furniture",
        "bookshelf",
        "Home & Kitchen › Furniture › Living Room Furniture › Bookcases",
        "Bookshelf",
        ("solid wood", "easy assembly", "5 tier", "space saving", "industrial style"),
        {"color": ("rustic brown", "white", "black", "walnut")},
        (39.0, 189.0),
        (("for Living Room", ("living", "room")), ("", ())),
    ),
    ProductType(
        "furniture",
        "throw pillow covers",
        "Home & Kitchen › Home Décor › Decorative Pillows › Throw Pillow Covers",
        "Throw Pillow Covers",
        ("velvet", "machine washable", "hidden zipper", "set of 2", "soft"),
        {
            "size": ("16x16 inch", "18x18 inch", "20x20 inch"),
            "color": ("sage green", "mustard", "cream", "navy blue"),
        },
        (8.0, 32.0),
        (("for Couch", ("couch",)), ("", ())),
    ),
    ProductType(
        "furniture",
        "area rug",
        "Home & Kitchen › Home Décor › Area Rugs",
        "Area Rug",
        ("non slip", "machine washable", "low pile", "boho", "stain resistant"),
        {"size": ("3x5 feet", "5x7 feet", "8x10 feet"), "color": ("beige", "grey", "blue", "multicolor")},
        (29.0, 229.0),
        (("for Bedroom", ("bedroom",)), ("", ())),
    ),
    ProductType(
        "furniture",
        "led desk lamp",
        "Home & Kitchen › Lighting › Lamps & Shades › Desk Lamps",
        "LED Desk Lamp",
        ("dimmable", "usb charging port", "eye caring", "touch control", "foldable"),
        {"color": ("black", "white", "silver")},
        (14.0, 69.0),
        (("for Home Office", ("home", "office")), ("", ())),
    ),
)
