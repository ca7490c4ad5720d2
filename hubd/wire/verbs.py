"""The wire vocabulary: the frame types the hub serves, one per field-rule
table (hubd/wire/fields.py; a unit test holds them to the handlers a composed
hub installs). It bounds the metric labels of frames received."""

from .fields import VERB_FIELDS

KNOWN_TYPES = frozenset(VERB_FIELDS)
