"""`tgs status`'s words for what tgsd reads of a production container."""
from tgs_runtime.commands.status import rhythm_words, stolen_words


def test_a_rhythm_is_said_not_idle_only_where_tgsd_takes_it_so():
    """Production on its host up to its rhythm is not idle up to 8.5 s of it (host spells of
    up to 4 s every iteration); a longer one is idle in each spell, and saying "not idle"
    there told the operator the opposite of what tgsd does."""
    assert rhythm_words(0.4) is None  # within the idle rule's half second: nothing to say
    assert rhythm_words(1.1) == "on its host up to 1.10 s between its bursts (its rhythm): not idle within it"
    assert rhythm_words(7.9).endswith("not idle within it")
    longer = rhythm_words(9.0)
    assert longer.startswith("on its host up to 9.00 s") and "idle in each spell" in longer, longer
    assert "not idle" not in longer, longer


def test_under_the_tgs_paper_controller_a_rhythm_is_not_said_to_be_idle_or_not():
    """The `tgs-paper` controller judges no idle spell: saying "not idle within it" there
    told the operator of a rule that controller does not have."""
    words = rhythm_words(1.1, "tgs-paper")
    assert words == "on its host up to 1.10 s between its bursts (its rhythm); the tgs-paper controller does not read it"
    assert "idle" not in rhythm_words(9.0, "tgs-paper")


def test_time_stolen_by_the_hypervisor_is_said_where_it_is_worth_saying():
    """On a shared VM tgsd takes a fall of production no deeper than the CPU time stolen for
    the machine's slowness: `tgs status` says how much was stolen, where it is 1 % or more."""
    assert stolen_words(None) is None and stolen_words(0.0) is None and stolen_words(0.009) is None
    words = stolen_words(0.112)
    assert words.startswith("the host's hypervisor took 11.2% of its CPU time over the last 3 s"), words
    assert "not taken for harm" in words
    assert "harm" not in stolen_words(0.112, "tgs-paper"), "the tgs-paper controller has no such rule"
