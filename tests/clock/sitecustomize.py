"""Imported at the start of every Python process while ``tests/clock`` is on ``PYTHONPATH``
(``pk_test_clock``): its clock shifted as the test run's is."""

import pk_test_clock

pk_test_clock.travel()
