"""Development helpers: a throwaway PostgreSQL (``embedded``) and the README's example
(``example``).

The running service never imports them; ``mediator server example`` and the tests do. The
throwaway server needs the ``demo`` extra (``pip install 'mediator[demo]'``)."""
