//! The bitmap backend our figures draw on: plotters' [`BitMapBackend`] with its text drawn
//! right.
//!
//! plotters 0.3.7 draws each glyph from the left edge of the glyph's ink, not from its origin,
//! so the left side bearing is lost: after a narrow glyph such as "." or "-" the next character
//! stands apart ("11. 0", "ZeRO- 3"). [`Bitmap`] delegates everything to the bitmap backend
//! except [`DrawingBackend::draw_text`], which places each glyph's outline where ab_glyph
//! positions it (origin + advance + kerning), with the same anchor and rotation rules as
//! plotters' default.

use ab_glyph::{Font, FontRef, ScaleFont};
use plotters::prelude::BitMapBackend;
use plotters_backend::text_anchor::{HPos, VPos};
use plotters_backend::{
    BackendColor, BackendCoord, BackendStyle, BackendTextStyle, DrawingBackend, DrawingErrorKind,
};

use super::FONT;

/// A PNG file's backend whose text keeps its glyphs' spacing.
pub struct Bitmap<'a> {
    inner: BitMapBackend<'a>,
    font: FontRef<'static>,
}

impl<'a> Bitmap<'a> {
    /// A `size` (width, height) bitmap written to `path` when presented.
    pub fn new(path: &'a std::path::Path, size: (u32, u32)) -> crate::Result<Self> {
        let font = FontRef::try_from_slice(FONT).map_err(|_| {
            crate::ReportError::Invalid("plot: the embedded font is invalid".into())
        })?;
        Ok(Bitmap {
            inner: BitMapBackend::new(path, size),
            font,
        })
    }
}

type Error<'a> = DrawingErrorKind<<BitMapBackend<'a> as DrawingBackend>::ErrorType>;

impl<'a> DrawingBackend for Bitmap<'a> {
    type ErrorType = <BitMapBackend<'a> as DrawingBackend>::ErrorType;

    fn get_size(&self) -> (u32, u32) {
        self.inner.get_size()
    }

    fn ensure_prepared(&mut self) -> Result<(), Error<'a>> {
        self.inner.ensure_prepared()
    }

    fn present(&mut self) -> Result<(), Error<'a>> {
        self.inner.present()
    }

    fn draw_pixel(&mut self, point: BackendCoord, color: BackendColor) -> Result<(), Error<'a>> {
        self.inner.draw_pixel(point, color)
    }

    fn draw_line<S: BackendStyle>(
        &mut self,
        from: BackendCoord,
        to: BackendCoord,
        style: &S,
    ) -> Result<(), Error<'a>> {
        self.inner.draw_line(from, to, style)
    }

    fn draw_rect<S: BackendStyle>(
        &mut self,
        upper_left: BackendCoord,
        bottom_right: BackendCoord,
        style: &S,
        fill: bool,
    ) -> Result<(), Error<'a>> {
        self.inner.draw_rect(upper_left, bottom_right, style, fill)
    }

    fn draw_path<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        path: I,
        style: &S,
    ) -> Result<(), Error<'a>> {
        self.inner.draw_path(path, style)
    }

    fn draw_circle<S: BackendStyle>(
        &mut self,
        center: BackendCoord,
        radius: u32,
        style: &S,
        fill: bool,
    ) -> Result<(), Error<'a>> {
        self.inner.draw_circle(center, radius, style, fill)
    }

    fn fill_polygon<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        vert: I,
        style: &S,
    ) -> Result<(), Error<'a>> {
        self.inner.fill_polygon(vert, style)
    }

    fn blit_bitmap(
        &mut self,
        pos: BackendCoord,
        size: (u32, u32),
        src: &[u8],
    ) -> Result<(), Error<'a>> {
        self.inner.blit_bitmap(pos, size, src)
    }

    /// plotters' default `draw_text` (anchor, then rotation about `pos`), with each glyph
    /// rasterised at its own origin.
    fn draw_text<S: BackendTextStyle>(
        &mut self,
        text: &str,
        style: &S,
        pos: BackendCoord,
    ) -> Result<(), Error<'a>> {
        let color = style.color();
        if color.alpha == 0.0 {
            return Ok(());
        }
        let ((min_x, min_y), (max_x, max_y)) = style
            .layout_box(text)
            .map_err(|e| DrawingErrorKind::FontError(Box::new(e)))?;
        let (width, height) = (max_x - min_x, max_y - min_y);
        let dx = match style.anchor().h_pos {
            HPos::Left => 0,
            HPos::Right => -width,
            HPos::Center => -width / 2,
        };
        let dy = match style.anchor().v_pos {
            VPos::Top => 0,
            VPos::Center => -height / 2,
            VPos::Bottom => -height,
        };
        let trans = style.transform();
        let (w, h) = self.get_size();
        let size = style.size() as f32;
        let font = self.font.as_scaled(size);
        // Collected first: the glyphs borrow the font, the pixels need `self` mutably.
        let mut pixels = Vec::new();
        let mut x = 0f32;
        let mut prev = None;
        for c in text.chars() {
            let id = font.glyph_id(c);
            if let Some(p) = prev {
                x += font.kern(p, id);
            }
            prev = Some(id);
            let glyph = id.with_scale_and_position(size, ab_glyph::point(x, 0.0));
            if let Some(outline) = font.outline_glyph(glyph) {
                let rect = outline.px_bounds();
                // As plotters places a glyph vertically; horizontally from its ink's real left.
                let (left, top) = (rect.min.x as i32, (size / 2.0 + rect.min.y) as i32);
                outline.draw(|gx, gy, coverage| {
                    pixels.push((left + gx as i32, top + gy as i32, coverage));
                });
            }
            x += font.h_advance(id);
        }
        for (gx, gy, coverage) in pixels {
            let (tx, ty) = trans.transform(gx + dx - min_x, gy + dy - min_y);
            let (px, py) = (pos.0 + tx, pos.1 + ty);
            if px >= 0 && px < w as i32 && py >= 0 && py < h as i32 {
                let c = BackendColor {
                    alpha: color.alpha * coverage as f64,
                    rgb: color.rgb,
                };
                self.inner.draw_pixel((px, py), c)?;
            }
        }
        Ok(())
    }
}
