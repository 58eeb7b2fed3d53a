"""The exercises of notebooks 01-06 and 08, the learner edition, and the minutes each lesson takes (every notebook).

    check       the checkers: an answer -> a success line, the usual mistake named, or "not answered yet"
    check_code  the checkers of exercises whose answer is code: run on inputs they make, against an oracle (01-03)
    check_code_models  the same for 05's Pareto front and 06's transfer set-up
    check_hvd   04's checker: the learner's Horovod script run on 2 workers, one line on what is wrong
    check_resume  08's checker: the learner's Horovod script stopped part way and resumed, against a run never stopped
    hvd_harness what each rank of a checked script did (run by horovodrun; imported by nothing)
    resume_harness  hvd_harness with what a resume needs recorded, and a run stopped part way (run by horovodrun)
    hvd_record  the harness's Keras patches and source reading: what a script did on one rank
    fitbench    `labkit fit-bench`: model.fit with Horovod's callbacks against the custom loop, through hvd_harness
    verdict     the machinery the checkers share: Spec, Verdict, the registry
    build       `labkit exercises list | build DIR`: the learner edition without solutions
    schedule    the learner's minutes per notebook and the workshop schedules they must fit

Sits above the lessons: its checkers call conv, flops, scale, sweep and transfer for the reference answers.
"""

# the library modules; hvd_harness and resume_harness are run by the ranks, not imported
__all__ = ["build", "check", "check_code", "check_code_models", "check_hvd", "check_resume", "fitbench", "hvd_record",
           "schedule", "verdict"]
