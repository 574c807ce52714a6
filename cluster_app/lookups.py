"""The `__any` lookup for ids: `field = ANY('{...}')`, one array parameter on PostgreSQL, IN elsewhere.

Django's `__in` makes each value a parameter of its own, which psycopg2 adapts one by one into the
statement's text, and every list length is a new statement text for PostgreSQL. `__any` sends one
array in PostgreSQL's text form. For the 1,200 job ids of a round's recheck, the calling process's
CPU per query went from 10.2 to 3.5 ms (its leases: 15.2 to 3.5 ms), measured by hand on an empty
table; most of what is left is Django resolving each item of the list as a possible expression.
For integer and UUID columns (their text form needs no quoting); values are prepared for the field as
`__in` prepares them; an empty list matches nothing.
"""

from __future__ import annotations

from django.db.models import Field, ForeignObject, Lookup


@ForeignObject.register_lookup  # a foreign key has lookups of its own: `job_id__any`
@Field.register_lookup
class AnyOf(Lookup):
    lookup_name = "any"
    ARRAY_TYPES = ("bigint", "integer", "smallint", "uuid")

    def get_prep_lookup(self):
        field = self.lhs.output_field
        return [field.get_prep_value(value) for value in self.rhs]

    def _values(self, connection) -> list:
        field = self.lhs.output_field
        return [field.get_db_prep_value(value, connection, prepared=True) for value in self.rhs]

    def as_sql(self, compiler, connection):
        lhs, lhs_params = self.process_lhs(compiler, connection)
        values = self._values(connection)
        if not values:
            return "1 = 0", []
        return f"{lhs} IN ({', '.join(['%s'] * len(values))})", [*lhs_params, *values]

    def as_postgresql(self, compiler, connection):
        lhs, lhs_params = self.process_lhs(compiler, connection)
        db_type = self.lhs.output_field.cast_db_type(connection)
        if db_type not in self.ARRAY_TYPES:
            raise ValueError(f"__any is for id columns (integers, UUIDs), not {db_type}")
        text = "{" + ",".join(str(value) for value in self._values(connection)) + "}"
        return f"{lhs} = ANY(%s::{db_type}[])", [*lhs_params, text]
