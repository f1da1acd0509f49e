//! The API as the compiler sees it: the intended uses compile (naming the
//! layer in a struct with one or two type parameters, a shared closure as a
//! cost, a store and an extractor of your own, a layer of tiers from a shared
//! closure kept in a struct with its handle), and the combinations that
//! cannot work fail to compile, with the message in `fail/*.stderr` (among
//! them tiers with an extractor of keys alone, and policies with one that
//! names tiers).
//!
//! After a change of wording, `TRYBUILD=overwrite cargo test --test compile`
//! rewrites the expected messages; read them before committing.

#[test]
fn intended_uses_compile_and_misuses_do_not() {
    let t = trybuild::TestCases::new();
    t.pass("pass/*.rs");
    t.compile_fail("fail/*.rs");
}
