use super::*;

#[test]
fn lost_answers_leave_the_outcome_unknown() {
    for code in [
        Code::DeadlineExceeded,
        Code::Unavailable,
        Code::Internal,
        Code::Unknown,
        Code::Cancelled,
    ] {
        assert!(is_unknown(code), "{code:?}");
    }
}

#[test]
fn refusals_are_definite_and_ok_is_ok() {
    assert_eq!(Outcome::of(Code::Ok), Outcome::Ok);
    for code in [
        Code::FailedPrecondition,
        Code::NotFound,
        Code::InvalidArgument,
        Code::AlreadyExists,
        Code::Aborted,
        Code::ResourceExhausted,
        Code::PermissionDenied,
        Code::Unauthenticated,
    ] {
        assert_eq!(Outcome::of(code), Outcome::Fail, "{code:?}");
        assert!(!is_unknown(code));
    }
}

#[test]
fn only_stored_outcomes_and_wrong_requests_settle_a_key() {
    for code in [
        Code::FailedPrecondition,
        Code::NotFound,
        Code::InvalidArgument,
    ] {
        assert!(Outcome::settles(&format!("{code:?}")), "{code:?}");
    }
    for code in [Code::Aborted, Code::ResourceExhausted, Code::Unavailable] {
        assert!(!Outcome::settles(&format!("{code:?}")), "{code:?}");
    }
}

#[test]
fn outcomes_serialise_in_lowercase() {
    assert_eq!(
        serde_json::to_string(&Outcome::Unknown).unwrap(),
        "\"unknown\""
    );
}
