"""Protocol types in one place: wire structs per method family, framing, and the error classes.

Everything a client or a subsystem needs to speak the wire contract lives here; nothing in this
package imports the server, the sessions or any subsystem.
"""
