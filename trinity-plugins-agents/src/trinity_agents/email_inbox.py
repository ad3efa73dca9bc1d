"""A synthetic company mailbox for ``email_search_workflow``, in Trinity-RFT's email database.

Trinity-RFT's email search example reads the Enron corpus (downloaded) into SQLite. This module
draws a corpus of the same shape from a seed, offline: a company and its outside contacts,
several inboxes (mail sent from or to a person), threads in them (a request, the reply that
holds a fact, an acknowledgement), and unrelated mail (newsletters, IT notices, social mail,
other mail about the same projects) around them. Each fact thread yields one question with its
answer, the ``message_id`` of the email that holds the answer, the inbox it is asked in and a
query date after the email: Trinity-RFT's task rows (``id``, ``question``, ``answer``,
``message_ids``, ``how_realistic``, ``inbox_address``, ``query_date``).

The database has Trinity-RFT's schema: ``emails`` (``message_id``, ``subject``,
``from_address``, ``date`` as ``YYYY-MM-DD HH:MM:SS``, ``body``, ``file_name``),
``recipients`` (``email_id``, ``recipient_address``, ``recipient_type`` ``to``/``cc``/``bcc``)
and the full-text index ``emails_fts`` (FTS5 over subject and body).

    python -m trinity_agents.tasks email_search OUT_DIR [--train N] [--test N] [--seed S]

writes ``OUT_DIR/emails.db``, ``OUT_DIR/train.jsonl`` and ``OUT_DIR/test.jsonl``; the same seed
gives the same files.
"""

from __future__ import annotations

import datetime as dt
import random
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DOMAIN = "northwind-energy.com"
FIRST = ["Alice", "Brian", "Carla", "Derek", "Elena", "Frank", "Grace", "Hector", "Irene", "James",
         "Karen", "Louis", "Maria", "Nathan", "Olga", "Peter", "Quinn", "Rosa", "Samuel", "Tina",
         "Victor", "Wendy", "Xavier", "Yusuf", "Zoe", "Martin", "Sally", "Kevin", "Diana", "Oscar"]  # fmt: skip
LAST = ["Adler", "Brooks", "Castillo", "Dunn", "Ellison", "Foster", "Garza", "Hughes", "Ibarra",
        "Jensen", "Keller", "Lopez", "Mercer", "Novak", "Ortega", "Parker", "Quintero", "Reyes",
        "Sandoval", "Turner", "Vance", "Whitaker", "Young", "Zimmer", "Hale", "Moss"]  # fmt: skip
PARTNERS = {"Bluecrest Capital": "bluecrest-capital.com", "Harborline Gas": "harborline-gas.com",
            "Meridian Legal": "meridian-legal.com", "Pinecone Power": "pinecone-power.com",
            "Redrock Pipeline": "redrock-pipeline.com", "Summit Utilities": "summit-utilities.com",
            "Tidewater Trading": "tidewater-trading.com", "Granite Insurance": "granite-insurance.com"}  # fmt: skip
CODENAMES = ["Falcon", "Bluebird", "Cascade", "Juniper", "Osprey", "Tamarack", "Sequoia", "Kestrel",
             "Obsidian", "Riverbend", "Saltgrass", "Ironwood", "Lantern", "Marigold", "Nightjar",
             "Pelican", "Quartz", "Redwing", "Sandpiper", "Thistle", "Umber", "Vireo", "Willow",
             "Yarrow", "Zephyr", "Antler", "Basalt", "Cobalt", "Driftwood", "Ember"]  # fmt: skip
PROJECTS = ["pipeline expansion", "storage lease", "power plant retrofit", "hedging program",
            "trading desk migration", "compressor upgrade", "wind farm bid", "billing system"]  # fmt: skip
CITIES = ["Denver", "Calgary", "Houston", "Omaha", "Portland", "Chicago", "Tulsa", "Boston",
          "Atlanta", "Phoenix", "Seattle", "Dallas", "Toronto", "London", "Oslo", "Madrid"]  # fmt: skip
AIRLINES = {"Continental": "CO", "United": "UA", "American": "AA", "Delta": "DL", "Southwest": "WN"}
DOCUMENTS = ["master netting agreement", "confidentiality agreement", "credit support annex",
             "transport service agreement", "interconnect agreement", "guaranty", "consent letter",
             "storage service agreement", "assignment letter", "side letter"]  # fmt: skip
TOPICS = ["West desk", "credit review", "risk committee", "storage nomination", "outage planning",
          "regulatory filing", "quarter close", "capacity auction", "weather desk", "curve review"]  # fmt: skip
ITEMS = ["laptops", "trading monitors", "server racks", "desk phones", "badge readers", "printers"]
DEPARTMENTS = ["gas trading", "structuring", "risk management", "legal", "origination", "IT"]
ROOMS = [
    f"{b} {n}" for b in ("EB", "ECS", "3AC") for n in (("3321", "2868", "06716", "4102", "1987", "3125"))
]

START = dt.datetime(2001, 1, 8, 8, 0)
SPAN_DAYS = 330
QUERY_LAG_DAYS = (1, 45)

SCHEMA = """
CREATE TABLE emails (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id TEXT UNIQUE,
    subject TEXT,
    from_address TEXT,
    date TEXT,
    body TEXT,
    file_name TEXT
);
CREATE TABLE recipients (
    email_id INTEGER,
    recipient_address TEXT,
    recipient_type TEXT,
    FOREIGN KEY(email_id) REFERENCES emails(id) ON DELETE CASCADE
);
CREATE INDEX idx_emails_from ON emails(from_address);
CREATE INDEX idx_emails_date ON emails(date);
CREATE INDEX idx_emails_message_id ON emails(message_id);
CREATE INDEX idx_recipients_address ON recipients(recipient_address);
CREATE INDEX idx_recipients_email_id ON recipients(email_id);
CREATE INDEX idx_recipients_address_email ON recipients(recipient_address, email_id);
CREATE VIRTUAL TABLE emails_fts USING fts5(subject, body, content='emails', content_rowid='id');
CREATE TRIGGER emails_ai AFTER INSERT ON emails BEGIN
    INSERT INTO emails_fts (rowid, subject, body) VALUES (new.id, new.subject, new.body);
END;
"""


@dataclass
class Person:
    first: str
    last: str
    address: str
    company: str = "Northwind Energy"

    @property
    def name(self) -> str:
        return f"{self.first} {self.last}"


@dataclass
class Email:
    """One email of the corpus (``date`` as ``YYYY-MM-DD HH:MM:SS``)."""

    message_id: str
    subject: str
    from_address: str
    date: str
    body: str
    file_name: str
    to: list[str] = field(default_factory=list)
    cc: list[str] = field(default_factory=list)
    bcc: list[str] = field(default_factory=list)

    def participants(self) -> set[str]:
        return {self.from_address, *self.to, *self.cc, *self.bcc}


@dataclass
class Fact:
    """What a fact thread's source email says: the question, its answer and the key that makes
    the question unique in the corpus."""

    key: tuple[Any, ...]
    subject: str
    request: str
    statement: str
    question: str
    answer: str


@dataclass
class Corpus:
    """The emails and the question rows (``questions`` in corpus order, before any split)."""

    emails: list[Email]
    questions: list[dict[str, Any]]


def _money(rng: random.Random, low: int, high: int, step: int) -> str:
    return f"${rng.randrange(low, high, step):,}"


def _day(when: dt.datetime) -> str:
    return f"{when:%A}, {when:%B} {when.day}"


def _time(rng: random.Random) -> str:
    hour, minute = rng.randint(8, 17), rng.choice([0, 15, 30, 45])
    return f"{(hour - 1) % 12 + 1}:{minute:02d} {'AM' if hour < 12 else 'PM'}"


# -- fact templates: (rng, sender, partner company, date of the source email) -> Fact ------------


def _meeting(rng: random.Random, sender: Person, partner: str, when: dt.datetime) -> Fact:
    project = f"{rng.choice(CODENAMES)} {rng.choice(PROJECTS)}"
    day = when + dt.timedelta(days=rng.randint(2, 9))
    room, time = rng.choice(ROOMS), _time(rng)
    if rng.random() < 0.5:
        question, answer = f"Which conference room is the {project} review meeting in?", room
    else:
        question, answer = f"What time is the {project} review meeting?", time
    return Fact(
        (project, "meeting"),
        f"{project.title()} review - new time",
        f"Do we have a time and a room for the {project} review yet?",
        f"The {project} review has moved to {_day(day)} at {time} in conference room {room}. "
        "Please bring the latest numbers and the open issues list.",
        question,
        answer,
    )


def _budget(rng: random.Random, sender: Person, partner: str, when: dt.datetime) -> Fact:
    project = f"{rng.choice(CODENAMES)} {rng.choice(PROJECTS)}"
    asked, approved = _money(rng, 400_000, 5_000_000, 25_000), _money(rng, 300_000, 4_000_000, 25_000)
    return Fact(
        (project, "budget"),
        f"{project.title()} budget",
        f"We put in for {asked} on the {project}. Any word from the committee?",
        f"The capital committee met this morning and approved a budget of {approved} for the "
        f"{project}. Spending above that needs another sign-off.",
        f"How much budget did the capital committee approve for the {project}?",
        approved,
    )


def _flight(rng: random.Random, sender: Person, partner: str, when: dt.datetime) -> Fact:
    city = rng.choice(CITIES)
    airline = rng.choice(sorted(AIRLINES))
    flight = f"{AIRLINES[airline]} {rng.randint(100, 2999)}"
    day = when + dt.timedelta(days=rng.randint(3, 20))
    return Fact(
        (sender.address, city, "flight"),
        f"Trip to {city}",
        f"Are you booked for the {city} trip? I need it for the expense report.",
        f"I am on {airline} flight {flight} to {city}, leaving {_day(day)} at {_time(rng)}. "
        "Hotel is booked for two nights.",
        f"What flight is {sender.name} taking to {city}?",
        flight,
    )


def _gas_deal(rng: random.Random, sender: Person, partner: str, when: dt.datetime) -> Fact:
    month = (when + dt.timedelta(days=40)).strftime("%B")
    price = f"${rng.randint(200, 699) / 100:.2f}/MMBtu"
    volume = rng.choice([5_000, 10_000, 15_000, 20_000, 25_000])
    return Fact(
        (partner, month, "gas deal"),
        f"{partner} {month} deal",
        f"Where did we end up with {partner} on the {month} baseload deal?",
        f"{partner} agreed to {price} for {volume:,} MMBtu/day for {month}, delivered at the "
        "Katy hub. I will send the confirm this afternoon.",
        f"What price did {partner} agree to for the {month} gas deal?",
        price,
    )


def _deadline(rng: random.Random, sender: Person, partner: str, when: dt.datetime) -> Fact:
    document = rng.choice(DOCUMENTS)
    due = when + dt.timedelta(days=rng.randint(3, 14))
    answer = f"{due:%B} {due.day}, {due.year}"
    return Fact(
        (partner, document),
        f"{partner} {document}",
        f"What is the deadline for the {document} with {partner}?",
        f"{partner} needs the signed {document} back by {_day(due)}, {due.year}. Legal has "
        "reviewed the last draft, so it only needs signatures.",
        f"By what date does {partner} need the signed {document}?",
        answer,
    )


def _dial_in(rng: random.Random, sender: Person, partner: str, when: dt.datetime) -> Fact:
    topic = rng.choice(TOPICS)
    code = str(rng.randint(100000, 999999))
    number = f"1-800-{rng.randint(200, 999)}-{rng.randint(1000, 9999)}"
    return Fact(
        (topic, "dial-in", when.isocalendar()[1]),
        f"{topic} call dial-in",
        f"Can someone send the dial-in for this week's {topic} call?",
        f"The {topic} call is on {number}, participant passcode {code}. We start on time.",
        f"What is the participant passcode for the {topic} call in the week of {when:%B} {when.day}?",
        code,
    )


def _shipment(rng: random.Random, sender: Person, partner: str, when: dt.datetime) -> Fact:
    item, city = rng.choice(ITEMS), rng.choice(CITIES)
    tracking = "1Z" + "".join(rng.choice("0123456789ABCDEFGHJKLMNPRSTUVWXY") for _ in range(12))
    count = rng.randint(4, 40)
    return Fact(
        (item, city, "shipment"),
        f"{item.capitalize()} for {city}",
        f"Did the {item} for the {city} office go out?",
        f"Yes, {count} {item} shipped to the {city} office today, tracking number {tracking}.",
        f"What is the tracking number of the {item} shipped to the {city} office?",
        tracking,
    )


def _hire(rng: random.Random, sender: Person, partner: str, when: dt.datetime) -> Fact:
    candidate = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
    start = when + dt.timedelta(days=rng.randint(14, 40))
    dept = rng.choice(DEPARTMENTS)
    answer = f"{start:%B} {start.day}, {start.year}"
    return Fact(
        (candidate, "hire"),
        f"Offer - {candidate}",
        f"Has {candidate} accepted the offer from {dept}?",
        f"{candidate} accepted the offer for the {dept} group and starts on {_day(start)}, "
        f"{start.year}. Please order a desk and a badge.",
        f"On what date does {candidate} start in the {dept} group?",
        answer,
    )


TEMPLATES: list[Callable[[random.Random, Person, str, dt.datetime], Fact]] = [
    _meeting, _budget, _flight, _gas_deal, _deadline, _dial_in, _shipment, _hire,
]  # fmt: skip

NOISE_SUBJECTS = [
    ("Weekly gas market update", "Prices were mixed this week. Storage injections came in above "
     "expectations and the forward curve flattened. Full report attached."),
    ("Outlook maintenance this Saturday", "Email will be unavailable from 8 PM Saturday to 2 AM "
     "Sunday while the servers are upgraded. Please plan accordingly."),
    ("Lunch on Friday?", "A few of us are going to the Tex-Mex place on Friday. Want to join?"),
    ("Parking garage closure", "Levels 3 and 4 of the garage are closed next week for repairs."),
    ("United Way campaign", "Thanks to everyone who has pledged so far. We are at 72% of goal."),
    ("Fantasy football", "Draft is Thursday at 6. Bring your own snacks."),
    ("Expense reports due", "Please submit this month's expense reports by the 25th."),
]  # fmt: skip


class _Builder:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.emails: list[Email] = []
        self._ids: set[str] = set()
        self._folders: dict[str, int] = {}

    def message_id(self, sender: Person) -> str:
        while True:
            mid = (
                f"<{self.rng.randint(10**7, 10**8 - 1)}.{self.rng.randint(10**12, 10**13 - 1)}"
                f".JavaMail.{sender.first.lower()}@thyme>"
            )
            if mid not in self._ids:
                self._ids.add(mid)
                return mid

    def add(self, sender: Person, to: list[Person], subject: str, body: str, when: dt.datetime,
            cc: list[Person] = ()) -> Email:  # fmt: skip
        folder = f"{sender.last.lower()}-{sender.first[0].lower()}/sent_items"
        self._folders[folder] = self._folders.get(folder, 0) + 1
        email = Email(
            message_id=self.message_id(sender),
            subject=subject,
            from_address=sender.address,
            date=when.strftime("%Y-%m-%d %H:%M:%S"),
            body=body,
            file_name=f"{folder}/{self._folders[folder]}.",
            to=[p.address for p in to],
            cc=[p.address for p in cc],
        )
        self.emails.append(email)
        return email


def _people(rng: random.Random) -> tuple[list[Person], dict[str, list[Person]]]:
    names = [(f, last) for f in FIRST for last in LAST]
    rng.shuffle(names)
    staff = [Person(f, last, f"{f.lower()}.{last.lower()}@{DOMAIN}") for f, last in names[:24]]
    partners: dict[str, list[Person]] = {}
    for i, (company, domain) in enumerate(sorted(PARTNERS.items())):
        f, last = names[24 + i]
        partners[company] = [Person(f, last, f"{f[0].lower()}{last.lower()}@{domain}", company)]
    return staff, partners


def generate_corpus(
    questions: int, seed: int = 0, *, inboxes: int = 6, noise_per_question: int = 3
) -> Corpus:
    """A corpus holding ``questions`` answerable facts (one thread each) spread over ``inboxes``
    inboxes, and ``noise_per_question`` unrelated emails per fact (deterministic for a seed).

    Every question is unique in the corpus (no other email states another answer to it), its
    source email is in the question's inbox (sent by or to ``inbox_address``) and dated before
    ``query_date``.
    """
    if questions < 1 or inboxes < 1:
        raise ValueError("need at least one question and one inbox")
    rng = random.Random(seed)
    staff, partners = _people(rng)
    owners = staff[:inboxes]
    build = _Builder(rng)
    used: set[tuple[Any, ...]] = set()
    rows: list[dict[str, Any]] = []
    for index in range(questions):
        owner = owners[index % len(owners)]
        others = [p for p in staff if p is not owner]
        company = rng.choice(sorted(partners))
        when = START + dt.timedelta(days=rng.randrange(SPAN_DAYS), hours=rng.randint(0, 9),
                                    minutes=rng.randint(0, 59))  # fmt: skip
        for _ in range(200):
            # the source email comes from a colleague or the partner, or from the owner himself
            sender = rng.choice([*rng.sample(others, 2), partners[company][0], owner])
            fact = rng.choice(TEMPLATES)(rng, sender, company, when)
            if fact.key not in used:
                break
        else:
            raise ValueError(f"cannot draw {questions} distinct questions; ask for fewer")
        used.add(fact.key)
        asker = owner if sender is not owner else rng.choice(others)
        cc = [p for p in rng.sample(others, rng.randint(0, 2)) if p not in (sender, asker)]
        request_at = when - dt.timedelta(hours=rng.randint(1, 30))
        build.add(asker, [sender], fact.subject, f"Hi {sender.first},\n\n{fact.request}\n\n{asker.first}",
                  request_at, cc)  # fmt: skip
        source = build.add(
            sender,
            [asker],
            f"RE: {fact.subject}",
            f"{asker.first},\n\n{fact.statement}\n\nThanks,\n{sender.first}",
            when,
            cc,
        )
        if rng.random() < 0.6:
            thanks = rng.choice(["Thanks, got it.", "Perfect, thank you.", "Great, I will pass it on."])
            build.add(asker, [sender], f"RE: {fact.subject}", f"{thanks}\n\n{asker.first}",
                      when + dt.timedelta(hours=rng.randint(1, 20)))  # fmt: skip
        query = when + dt.timedelta(days=rng.randint(*QUERY_LAG_DAYS))
        rows.append(
            {
                "id": index,
                "question": fact.question,
                "answer": fact.answer,
                "message_ids": [source.message_id],
                "how_realistic": round(rng.uniform(0.6, 1.0), 2),
                "inbox_address": owner.address,
                "query_date": query.strftime("%Y-%m-%d"),
                "_project": fact.subject,
            }
        )
    # Unrelated mail, some of it about the same subjects (without the answer).
    everyone = staff + [p for group in partners.values() for p in group]
    for i in range(questions * noise_per_question):
        owner = owners[i % len(owners)]
        when = START + dt.timedelta(days=rng.randrange(SPAN_DAYS + 60), hours=rng.randint(0, 10))
        sender = rng.choice([p for p in everyone if p is not owner])
        if rng.random() < 0.3:
            subject = rng.choice(rows)["_project"]
            body = rng.choice(
                [
                    f"Can someone send me the latest slides on {subject.lower()}? I want to read up before Monday.",
                    f"FYI, {subject.lower()} is on the agenda for the staff meeting. No decisions yet.",
                    f"I have not seen anything on {subject.lower()} since last week. Still waiting.",
                ]
            )
            subject = f"Question on {subject}"
        else:
            subject, body = rng.choice(NOISE_SUBJECTS)
        cc = rng.sample(staff, rng.randint(0, 2))
        build.add(sender, [owner], subject, f"{body}\n\n{sender.first}", when,
                  [p for p in cc if p is not owner and p is not sender])  # fmt: skip
    for row in rows:
        del row["_project"]
    return Corpus(build.emails, rows)


def write_database(path: str | Path, emails: list[Email]) -> Path:
    """Write ``emails`` into a new SQLite database at ``path`` (replacing a file there) with
    Trinity-RFT's schema and full-text index."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.unlink()
    conn = sqlite3.connect(path)
    try:
        conn.executescript(SCHEMA)
        for email in sorted(emails, key=lambda e: (e.date, e.message_id)):
            cursor = conn.execute(
                "INSERT INTO emails (message_id, subject, from_address, date, body, file_name) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (
                    email.message_id,
                    email.subject,
                    email.from_address,
                    email.date,
                    email.body,
                    email.file_name,
                ),
            )
            rows = [(cursor.lastrowid, a, kind) for kind in ("to", "cc", "bcc") for a in getattr(email, kind)]
            conn.executemany(
                "INSERT INTO recipients (email_id, recipient_address, recipient_type) VALUES (?, ?, ?)", rows
            )
        conn.commit()
    finally:
        conn.close()
    return path


def write_email_search(out: str | Path, train: int, test: int, seed: int = 0) -> tuple[Path, int]:
    """Draw one corpus for ``train + test`` questions and write ``out/emails.db``,
    ``out/train.jsonl`` and ``out/test.jsonl`` (the questions split at random, deterministic for
    a seed). Returns the database's path and its number of emails."""
    from trinity_agents.tasks import write_jsonl

    out = Path(out)
    corpus = generate_corpus(train + test, seed)
    questions = list(corpus.questions)
    random.Random(seed + 1).shuffle(questions)
    db = write_database(out / "emails.db", corpus.emails)
    write_jsonl(out / "train.jsonl", questions[:train])
    write_jsonl(out / "test.jsonl", questions[train:])
    return db, len(corpus.emails)


__all__ = ["SCHEMA", "Corpus", "Email", "generate_corpus", "write_database", "write_email_search"]
